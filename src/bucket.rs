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
        let valid_zone = zone.split_once("-az").is_some_and(|(region, n)| {
            !region.is_empty()
                && region.bytes().all(|b| b.is_ascii_alphanumeric())
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
    if name.contains("--") || name.ends_with("-s3alias") || name.starts_with("xn--") {
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
    let prefix = zone.split_once("-az")?.0;
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
        assert!(!parse("my.bucket-1").unwrap().is_directory());
        assert_eq!(parse("s3://plain-bucket/").unwrap().name, "plain-bucket");
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
