//! `authenticationSource: pod` (Mountpoint's attribute): the mount uses the pod's IAM role, not the
//! driver's. kubelet passes the pod's service-account token for the audience sts.amazonaws.com in the
//! volume context (the CSIDriver's `tokenRequests`), and again on every republish before it expires
//! (`requiresRepublish`). The daemon gets it as a web-identity token file and assumes the role itself.
//! The role ARN is the service account's IRSA annotation, which only the API server knows; the driver reads
//! no API, so the PV names it in `roleArn`.

use std::collections::HashMap;
use std::path::Path;

pub const ATTR_AUTH_SOURCE: &str = "authenticationSource";
pub const ATTR_ROLE_ARN: &str = "roleArn";
const TOKENS_KEY: &str = "csi.storage.k8s.io/serviceAccount.tokens";
pub const AUDIENCE: &str = "sts.amazonaws.com";

/// Variables that would hand the daemon credentials other than the pod's (the driver's keys, profile
/// files, container endpoints, its own IRSA token): a pod-authenticated mount must fail rather than fall
/// back to them.
const OTHER_CREDENTIALS: &[&str] = &[
    "AWS_ACCESS_KEY_ID",
    "AWS_SECRET_ACCESS_KEY",
    "AWS_SESSION_TOKEN",
    "AWS_PROFILE",
    "AWS_DEFAULT_PROFILE",
    "AWS_CONTAINER_CREDENTIALS_FULL_URI",
    "AWS_CONTAINER_CREDENTIALS_RELATIVE_URI",
    "AWS_CONTAINER_AUTHORIZATION_TOKEN",
    "AWS_CONTAINER_AUTHORIZATION_TOKEN_FILE",
];

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PodCredentials {
    pub token: String,
    pub role_arn: String,
    pub session_name: String,
}

/// The pod's credentials when the volume asks for them; errors are for the PV author (InvalidArgument).
pub fn from_context(context: &HashMap<String, String>) -> Result<Option<PodCredentials>, String> {
    let source = context
        .get(ATTR_AUTH_SOURCE)
        .map(String::as_str)
        .unwrap_or("driver");
    let role_arn = context.get(ATTR_ROLE_ARN);
    match source {
        "driver" if role_arn.is_none() => return Ok(None),
        "driver" => return Err(format!("{ATTR_ROLE_ARN} needs {ATTR_AUTH_SOURCE}: pod")),
        "pod" => {}
        other => {
            return Err(format!(
                "{ATTR_AUTH_SOURCE} {other:?} is neither driver nor pod"
            ));
        }
    }
    let role_arn = role_arn.ok_or_else(|| {
        format!("{ATTR_AUTH_SOURCE}: pod needs {ATTR_ROLE_ARN} (the pod's IAM role)")
    })?;
    if !valid_role_arn(role_arn) {
        return Err(format!(
            "{ATTR_ROLE_ARN} {role_arn:?} is not an IAM role ARN"
        ));
    }
    let tokens = context.get(TOKENS_KEY).ok_or_else(|| {
        format!(
            "{ATTR_AUTH_SOURCE}: pod needs the pod's token: the CSIDriver must request one \
             (tokenRequests with audience {AUDIENCE})"
        )
    })?;
    let tokens: serde_json::Value =
        serde_json::from_str(tokens).map_err(|e| format!("{TOKENS_KEY}: {e}"))?;
    let token = tokens
        .get(AUDIENCE)
        .and_then(|t| t.get("token"))
        .and_then(|t| t.as_str())
        .ok_or_else(|| format!("{TOKENS_KEY} has no token for the audience {AUDIENCE}"))?;
    // A JWT: base64url parts joined by dots. Anything else is not written to a file for a daemon.
    if token.is_empty()
        || !token
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || "-_.".contains(c))
    {
        return Err(format!("{TOKENS_KEY}: the token is not a JWT"));
    }
    Ok(Some(PodCredentials {
        token: token.to_string(),
        role_arn: role_arn.clone(),
        session_name: session_name(context),
    }))
}

/// arn:PARTITION:iam::ACCOUNT:role/PATH/NAME
fn valid_role_arn(arn: &str) -> bool {
    let parts: Vec<&str> = arn.splitn(6, ':').collect();
    let [arn_word, partition, service, region, account, resource] = parts[..] else {
        return false;
    };
    arn_word == "arn"
        && partition.starts_with("aws")
        && service == "iam"
        && region.is_empty()
        && account.len() == 12
        && account.chars().all(|c| c.is_ascii_digit())
        && resource.strip_prefix("role/").is_some_and(|name| {
            !name.is_empty()
                && name
                    .chars()
                    .all(|c| c.is_ascii_alphanumeric() || "+=,.@_-/".contains(c))
        })
}

/// `expressfs-NAMESPACE-POD`, in the characters and length STS allows, so CloudTrail shows which pod.
fn session_name(context: &HashMap<String, String>) -> String {
    let get = |k: &str| {
        context
            .get(&format!("csi.storage.k8s.io/{k}"))
            .cloned()
            .unwrap_or_default()
    };
    let name = format!("expressfs-{}-{}", get("pod.namespace"), get("pod.name"));
    let name: String = name
        .chars()
        .map(|c| {
            if c.is_ascii_alphanumeric() || "+=,.@-_".contains(c) {
                c
            } else {
                '-'
            }
        })
        .take(64)
        .collect();
    name.trim_end_matches('-').to_string()
}

impl PodCredentials {
    /// The daemon's environment changes: what to drop, then what to set.
    pub fn environment(
        &self,
        token_file: &Path,
    ) -> (&'static [&'static str], Vec<(String, String)>) {
        let set = [
            (
                "AWS_WEB_IDENTITY_TOKEN_FILE",
                token_file.to_string_lossy().into_owned(),
            ),
            ("AWS_ROLE_ARN", self.role_arn.clone()),
            ("AWS_ROLE_SESSION_NAME", self.session_name.clone()),
            // Root's profile files on the node, and the node's instance role, are not the pod's.
            ("AWS_SHARED_CREDENTIALS_FILE", "/dev/null".into()),
            ("AWS_CONFIG_FILE", "/dev/null".into()),
            ("AWS_EC2_METADATA_DISABLED", "true".into()),
        ];
        (
            OTHER_CREDENTIALS,
            set.into_iter().map(|(k, v)| (k.to_string(), v)).collect(),
        )
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn context(pairs: &[(&str, &str)]) -> HashMap<String, String> {
        pairs
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect()
    }

    const ROLE: &str = "arn:aws:iam::111122223333:role/training/reader";
    const TOKENS: &str = r#"{"sts.amazonaws.com":{"token":"eyJh.eyJz.c2ln","expirationTimestamp":"2030-01-01T00:00:00Z"}}"#;

    #[test]
    fn pod_token_and_role() {
        let creds = from_context(&context(&[
            ("authenticationSource", "pod"),
            ("roleArn", ROLE),
            (TOKENS_KEY, TOKENS),
            ("csi.storage.k8s.io/pod.namespace", "ml"),
            ("csi.storage.k8s.io/pod.name", "trainer/0"),
        ]))
        .unwrap()
        .unwrap();
        assert_eq!(creds.token, "eyJh.eyJz.c2ln");
        assert_eq!(creds.role_arn, ROLE);
        assert_eq!(creds.session_name, "expressfs-ml-trainer-0");
        let (removed, set) = creds.environment(Path::new("/t/token"));
        assert!(removed.contains(&"AWS_ACCESS_KEY_ID"));
        assert!(set.contains(&("AWS_WEB_IDENTITY_TOKEN_FILE".into(), "/t/token".into())));
        assert!(set.contains(&("AWS_ROLE_ARN".into(), ROLE.into())));
        assert!(set.contains(&("AWS_EC2_METADATA_DISABLED".into(), "true".into())));
    }

    #[test]
    fn driver_is_the_default_and_bad_requests_are_refused() {
        assert_eq!(from_context(&context(&[])).unwrap(), None);
        assert_eq!(
            from_context(&context(&[("authenticationSource", "driver")])).unwrap(),
            None
        );
        let refused = |pairs: &[(&str, &str)]| from_context(&context(pairs)).unwrap_err();
        assert!(refused(&[("roleArn", ROLE)]).contains("needs authenticationSource"));
        assert!(refused(&[("authenticationSource", "node")]).contains("neither"));
        assert!(
            refused(&[("authenticationSource", "pod"), (TOKENS_KEY, TOKENS)]).contains("roleArn")
        );
        assert!(
            refused(&[("authenticationSource", "pod"), ("roleArn", ROLE)])
                .contains("tokenRequests")
        );
        for bad in [
            "arn:aws:iam::1111:role/x",
            "arn:aws:s3:::bucket",
            "arn:aws:iam::111122223333:user/x",
            "arn:aws:iam::111122223333:role/",
        ] {
            let e = refused(&[
                ("authenticationSource", "pod"),
                ("roleArn", bad),
                (TOKENS_KEY, TOKENS),
            ]);
            assert!(e.contains("not an IAM role"), "{bad}: {e}");
        }
        let other_audience = r#"{"vault":{"token":"a.b.c"}}"#;
        let e = refused(&[
            ("authenticationSource", "pod"),
            ("roleArn", ROLE),
            (TOKENS_KEY, other_audience),
        ]);
        assert!(e.contains("no token for the audience"), "{e}");
        let not_jwt = r#"{"sts.amazonaws.com":{"token":"a\nb"}}"#;
        let e = refused(&[
            ("authenticationSource", "pod"),
            ("roleArn", ROLE),
            (TOKENS_KEY, not_jwt),
        ]);
        assert!(e.contains("not a JWT"), "{e}");
    }
}
