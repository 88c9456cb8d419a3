//! Bucket names: directory buckets (`base--azid--x-s3`) and general-purpose buckets, checked by S3's
//! rules, and the region a directory bucket's AZ ID implies.

/// What a bucket name says about the bucket.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct BucketName {
    pub name: String,
    /// `Some(az_id)` for a directory bucket.
    pub zone: Option<String>,
}

impl BucketName {
    pub fn is_directory(&self) -> bool {
        self.zone.is_some()
    }

    /// An access point ARN (`arn:aws:s3:REGION:ACCOUNT:accesspoint/NAME`), which the SDK's endpoint rules
    /// turn into the access point's own host.
    pub fn is_arn(&self) -> bool {
        self.name.starts_with("arn:")
    }

    /// The region an access point ARN names (empty for a multi-region access point).
    pub fn arn_region(&self) -> Option<&str> {
        self.is_arn()
            .then(|| self.name.split(':').nth(3))
            .flatten()
            .filter(|r| !r.is_empty())
    }
}

/// What the first argument names: a bucket, access point ARN or alias, or `s3://bucket/prefix/` (mount-s3's
/// forms). Returns the bucket and the URI's prefix, if any.
pub fn parse_source(input: &str) -> Result<(BucketName, Option<String>), String> {
    if let Some(rest) = input.strip_prefix("s3://") {
        let (bucket, prefix) = rest.split_once('/').unwrap_or((rest, ""));
        if bucket.starts_with("arn:") {
            return Err(format!(
                "{input:?}: an access point ARN cannot be written as an s3:// URI; give the ARN alone (and --prefix)"
            ));
        }
        if !prefix.is_empty() && !prefix.ends_with('/') {
            return Err(format!(
                "{input:?}: the prefix in an s3:// URI must end in '/'"
            ));
        }
        let prefix = (!prefix.is_empty()).then(|| prefix.to_string());
        return Ok((parse(bucket)?, prefix));
    }
    if input.starts_with("arn:") {
        return parse_access_point_arn(input).map(|b| (b, None));
    }
    Ok((parse(input)?, None))
}

/// `arn:PARTITION:s3:REGION:ACCOUNT:accesspoint/NAME` (also Object Lambda's `s3-object-lambda`, and
/// multi-region access points, whose region is empty).
fn parse_access_point_arn(arn: &str) -> Result<BucketName, String> {
    let parts: Vec<&str> = arn.splitn(6, ':').collect();
    if parts.get(2) == Some(&"s3-outposts") {
        return Err(format!(
            "{arn:?}: S3 on Outposts is not supported (its buckets take no checksums and are reached through the Outposts endpoint)"
        ));
    }
    let valid = parts.len() == 6
        && !parts[1].is_empty()
        && matches!(parts[2], "s3" | "s3-object-lambda")
        && parts[4].len() == 12
        && parts[4].bytes().all(|b| b.is_ascii_digit())
        && parts[5]
            .strip_prefix("accesspoint/")
            .or_else(|| parts[5].strip_prefix("accesspoint:"))
            .is_some_and(|name| !name.is_empty() && !name.contains('/'));
    if !valid {
        return Err(format!(
            "{arn:?} is not an access point ARN (arn:aws:s3:REGION:ACCOUNT:accesspoint/NAME)"
        ));
    }
    Ok(BucketName {
        name: arn.to_string(),
        zone: None,
    })
}

/// Region codes used in AZ IDs (`use1-az4` is in us-east-1).
const AZ_PREFIXES: &[(&str, &str)] = &[
    ("use1", "us-east-1"),
    ("use2", "us-east-2"),
    ("usw1", "us-west-1"),
    ("usw2", "us-west-2"),
    ("apne1", "ap-northeast-1"),
    ("apne2", "ap-northeast-2"),
    ("apne3", "ap-northeast-3"),
    ("aps1", "ap-south-1"),
    ("apse1", "ap-southeast-1"),
    ("apse2", "ap-southeast-2"),
    ("euw1", "eu-west-1"),
    ("euw2", "eu-west-2"),
    ("euw3", "eu-west-3"),
    ("euc1", "eu-central-1"),
    ("eun1", "eu-north-1"),
    ("cac1", "ca-central-1"),
    ("sae1", "sa-east-1"),
];

/// Parses and validates a bucket name (also accepts `s3://name`).
pub fn parse(input: &str) -> Result<BucketName, String> {
    let name = input
        .strip_prefix("s3://")
        .unwrap_or(input)
        .trim_end_matches('/');
    if name.contains('/') {
        return Err(format!(
            "{input:?} is not a bucket name: put the key prefix in --prefix"
        ));
    }
    if name.len() < 3 || name.len() > 63 {
        return Err(format!(
            "bucket name {name:?} must be 3 to 63 characters long"
        ));
    }
    if let Some(c) = name
        .chars()
        .find(|c| !(c.is_ascii_lowercase() || c.is_ascii_digit() || *c == '-' || *c == '.'))
    {
        return Err(format!(
            "bucket name {name:?} contains {c:?}: only lowercase letters, digits, '-' and '.' are allowed"
        ));
    }
    let (first, last) = (name.as_bytes()[0], name.as_bytes()[name.len() - 1]);
    if !first.is_ascii_alphanumeric() || !last.is_ascii_alphanumeric() {
        return Err(format!(
            "bucket name {name:?} must begin and end with a letter or digit"
        ));
    }
    if name.contains("..") || name.parse::<std::net::Ipv4Addr>().is_ok() {
        return Err(format!(
            "bucket name {name:?} must not contain '..' or be an IP address"
        ));
    }
    if let Some(base_and_zone) = name.strip_suffix("--x-s3") {
        let Some((base, zone)) = base_and_zone.rsplit_once("--") else {
            return Err(format!(
                "directory bucket name {name:?} must look like base-name--use1-az4--x-s3"
            ));
        };
        if base.is_empty() || base.contains("--") || base.contains('.') {
            return Err(format!(
                "directory bucket name {name:?}: the base name must be non-empty, without '--' or '.'"
            ));
        }
        // An AZ ID (`use1-az4`), or a Local Zone's (`usw2-lax1-az1`).
        let valid_zone = zone.rsplit_once("-az").is_some_and(|(region, n)| {
            region
                .split('-')
                .all(|part| !part.is_empty() && part.bytes().all(|b| b.is_ascii_alphanumeric()))
                && !n.is_empty()
                && n.bytes().all(|b| b.is_ascii_digit())
        });
        if !valid_zone {
            return Err(format!(
                "directory bucket name {name:?}: {zone:?} is not an availability zone ID like use1-az4"
            ));
        }
        return Ok(BucketName {
            name: name.to_string(),
            zone: Some(zone.to_string()),
        });
    }
    // Access point aliases (general purpose `...-s3alias`, Object Lambda `...--ol-s3`) are used as names.
    if name.ends_with("-s3alias") || name.ends_with("--ol-s3") {
        return Ok(BucketName {
            name: name.to_string(),
            zone: None,
        });
    }
    if name.contains("--") || name.starts_with("xn--") {
        return Err(format!(
            "bucket name {name:?} uses a reserved form ('--' is only for directory buckets: base--azid--x-s3)"
        ));
    }
    Ok(BucketName {
        name: name.to_string(),
        zone: None,
    })
}

/// The region of an AZ ID such as `use1-az4`, when known.
pub fn region_of_zone(zone: &str) -> Option<&'static str> {
    // A Local Zone's ID starts with its parent region's code too (`usw2-lax1-az1`).
    let prefix = zone.split(['-']).next()?;
    AZ_PREFIXES
        .iter()
        .find(|(p, _)| *p == prefix)
        .map(|(_, r)| *r)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn recognises_both_kinds() {
        let d = parse("data--use1-az4--x-s3").unwrap();
        assert_eq!(d.zone.as_deref(), Some("use1-az4"));
        assert_eq!(region_of_zone("use1-az4"), Some("us-east-1"));
        assert_eq!(region_of_zone("usw2-az1"), Some("us-west-2"));
        assert_eq!(region_of_zone("zzz9-az1"), None);
        // Directory buckets in a Local Zone name its ID, which has a hyphen of its own.
        let local = parse("data--usw2-lax1-az1--x-s3").unwrap();
        assert_eq!(local.zone.as_deref(), Some("usw2-lax1-az1"));
        assert_eq!(region_of_zone("usw2-lax1-az1"), Some("us-west-2"));
        assert!(parse("data--usw2--az1--x-s3").is_err());
        assert!(parse("data--usw2-lax1-az--x-s3").is_err());
        assert!(!parse("my.bucket-1").unwrap().is_directory());
        assert_eq!(parse("s3://plain-bucket/").unwrap().name, "plain-bucket");
    }

    #[test]
    fn uris_arns_and_aliases() {
        let (b, p) = parse_source("s3://data--use1-az4--x-s3/train/2024/").unwrap();
        assert_eq!(
            (b.name.as_str(), p.as_deref()),
            ("data--use1-az4--x-s3", Some("train/2024/"))
        );
        assert!(b.is_directory());
        let (b, p) = parse_source("s3://plain-bucket").unwrap();
        assert_eq!((b.name.as_str(), p), ("plain-bucket", None));
        assert_eq!(parse_source("s3://plain-bucket/").unwrap().1, None);
        assert!(
            parse_source("s3://plain-bucket/train")
                .unwrap_err()
                .contains("end in '/'")
        );
        let arn = "arn:aws:s3:us-west-2:123456789012:accesspoint/my-ap";
        let (b, p) = parse_source(arn).unwrap();
        assert!(b.is_arn() && !b.is_directory() && p.is_none());
        assert_eq!(b.arn_region(), Some("us-west-2"));
        let mrap = parse_source("arn:aws:s3::123456789012:accesspoint/mfzwi23gnjvgw.mrap")
            .unwrap()
            .0;
        assert_eq!(mrap.arn_region(), None);
        assert!(
            parse_source(&format!("s3://{arn}/"))
                .unwrap_err()
                .contains("ARN")
        );
        for bad in [
            "arn:aws:s3:us-west-2:123:accesspoint/ap",
            "arn:aws:ec2:us-west-2:123456789012:accesspoint/ap",
            "arn:aws:s3:us-west-2:123456789012:bucket/b",
            "arn:aws:s3-outposts:us-west-2:123456789012:outpost/op-01ac5d28a6a232904/bucket/b",
        ] {
            assert!(parse_source(bad).is_err(), "{bad}");
        }
        let alias = parse_source("my-ap-hrzrlukc5m36ft7okagglf3gmwluquse1b-s3alias")
            .unwrap()
            .0;
        assert!(!alias.is_directory() && !alias.is_arn());
        assert!(parse("my-ol-ap-abcdefghijk--ol-s3").is_ok());
    }

    #[test]
    fn explains_bad_names() {
        for (bad, says) in [
            ("ab", "3 to 63"),
            ("Upper", "contains 'U'"),
            ("-start", "begin and end"),
            ("a..b", "'..'"),
            ("192.168.1.1", "IP address"),
            ("x--y", "reserved"),
            ("base--nozone--x-s3", "availability zone"),
            ("--use1-az4--x-s3", "begin and end"),
            ("a--b--use1-az4--x-s3", "base name"),
            ("bucket/prefix", "--prefix"),
        ] {
            let err = parse(bad).unwrap_err();
            assert!(err.contains(says), "{bad}: {err}");
        }
    }
}
