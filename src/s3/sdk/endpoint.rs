//! Endpoint resolution once per bucket, not twice per request.
//!
//! The SDK evaluates S3's endpoint rules for every request, twice (once to choose the auth scheme, once for
//! the URL), and remembers only the last answer, keyed by parameters that include the object key: with a
//! new key per request it never hits. That evaluation was 5-7% of the daemon's CPU on small files
//! (docs/BENCHMARKS.md). The rules of the SDK we build with never read the key, the listing prefix or the
//! copy source (they are only bound as parameters), so the answer depends on the bucket and the client's
//! settings alone: [`PerBucketEndpoints`] clears those three before asking the SDK's resolver, whose own
//! cache then answers every request after the first. The test below fails if an SDK upgrade makes any of
//! them change an endpoint we use.

use aws_sdk_s3::config::endpoint::{DefaultResolver, EndpointFuture, Params, ResolveEndpoint};

#[derive(Debug, Default)]
pub(super) struct PerBucketEndpoints {
    rules: DefaultResolver,
}

impl ResolveEndpoint for PerBucketEndpoints {
    fn resolve_endpoint<'a>(&'a self, params: &'a Params) -> EndpointFuture<'a> {
        match without_object(params) {
            Some(general) => {
                EndpointFuture::new(async move { self.rules.resolve_endpoint(&general).await })
            }
            // Parameters we cannot rebuild are resolved as they are.
            None => self.rules.resolve_endpoint(params),
        }
    }
}

/// `params` without the per-request object parameters (key, prefix, copy source).
fn without_object(params: &Params) -> Option<Params> {
    Params::builder()
        .set_bucket(params.bucket().map(str::to_string))
        .set_region(params.region().map(str::to_string))
        .set_use_fips(params.use_fips())
        .set_use_dual_stack(params.use_dual_stack())
        .set_endpoint(params.endpoint().map(str::to_string))
        .set_force_path_style(params.force_path_style())
        .set_accelerate(params.accelerate())
        .set_use_global_endpoint(params.use_global_endpoint())
        .set_use_object_lambda_endpoint(params.use_object_lambda_endpoint())
        .set_disable_access_points(params.disable_access_points())
        .set_disable_multi_region_access_points(params.disable_multi_region_access_points())
        .set_use_arn_region(params.use_arn_region())
        .set_use_s3_express_control_endpoint(params.use_s3_express_control_endpoint())
        .set_disable_s3_express_session_auth(params.disable_s3_express_session_auth())
        .build()
        .ok()
}

#[cfg(test)]
mod tests {
    use super::*;
    use aws_sdk_s3::config::endpoint::ParamsBuilder;

    fn settings() -> Vec<(&'static str, ParamsBuilder)> {
        let base = || Params::builder().region("us-east-1").use_fips(false);
        vec![
            (
                "directory bucket, zonal endpoint",
                base()
                    .bucket("data--use1-az4--x-s3")
                    .disable_s3_express_session_auth(false),
            ),
            (
                "directory bucket, custom endpoint, path style",
                base()
                    .bucket("data--use1-az4--x-s3")
                    .endpoint("http://127.0.0.1:9000")
                    .force_path_style(true),
            ),
            (
                "general-purpose bucket, virtual host, dual stack",
                base().bucket("my-data").use_dual_stack(true),
            ),
            (
                "access point ARN",
                base().bucket("arn:aws:s3:us-east-1:123456789012:accesspoint/ap"),
            ),
        ]
    }

    #[tokio::test]
    async fn the_key_prefix_and_copy_source_change_no_endpoint() {
        let rules = DefaultResolver::new();
        for (name, settings) in settings() {
            let plain = rules
                .resolve_endpoint(&settings.clone().build().unwrap())
                .await
                .unwrap_or_else(|e| panic!("{name}: {e}"));
            for with_object in [
                settings.clone().key("a/b.jpg"),
                settings.clone().key("..%2F/x?y"),
                settings.clone().prefix("a/"),
                settings.clone().copy_source("other/key"),
            ] {
                let params = with_object.build().unwrap();
                let resolved = rules.resolve_endpoint(&params).await.unwrap();
                assert_eq!(resolved, plain, "{name}: {params:?}");
                let ours = PerBucketEndpoints::default()
                    .resolve_endpoint(&params)
                    .await
                    .unwrap();
                assert_eq!(ours, plain, "{name}: {params:?}");
            }
        }
    }

    #[test]
    fn every_setting_but_the_object_survives() {
        // A parameter added by an SDK upgrade would be dropped by `without_object`: count them.
        let params = Params::builder().bucket("b").build().unwrap();
        let fields = format!("{params:?}").split(", ").count();
        assert_eq!(
            fields, 17,
            "Params changed: carry the new fields over in without_object"
        );
        for (name, settings) in settings() {
            let params = settings.clone().key("k").prefix("p").build().unwrap();
            let general = without_object(&params).unwrap();
            assert_eq!(general, settings.build().unwrap(), "{name}");
        }
    }
}
