//! Bucket-level operations: CreateSession, HeadBucket, CreateBucket, DeleteBucket, ListBuckets, location.

use std::sync::Arc;
use std::time::{Instant, SystemTime};

use base64::Engine;

use crate::body::ResponseBody;
use crate::error::S3Error;
use crate::server::{Answer, Ctx, State, respond, set_header, xml_response};
use crate::store::Session;
use crate::xml::{self, HEADER, NS, el};

fn random_string(len: usize, alphabet: &[u8]) -> String {
    (0..len)
        .map(|_| alphabet[rand::random_range(0..alphabet.len())] as char)
        .collect()
}

/// Issues S3 Express session credentials for one directory bucket.
pub fn create_session(state: &Arc<State>, ctx: &Ctx) -> Answer {
    // Mountpoint's CRT client, path-style on a local endpoint, sends `GET /?session=` naming no bucket (the
    // real service always has the bucket in its zonal host name): such a session is good for every
    // directory bucket here, which the signature check allows.
    let directory = ctx.bucket.is_empty() || {
        let buckets = state.store.buckets();
        buckets
            .get(&ctx.bucket)
            .ok_or_else(S3Error::no_such_bucket)?
            .directory
    };
    if !directory {
        return Err(S3Error::invalid_request(
            "CreateSession is only supported on directory buckets",
        ));
    }
    if ctx.principal != crate::server::Principal::Root {
        return Err(S3Error::access_denied(
            "CreateSession must be signed with long-term credentials",
        ));
    }
    let read_only = match ctx.header("x-amz-create-session-mode") {
        None | Some("ReadWrite") => false,
        Some("ReadOnly") => true,
        Some(other) => {
            return Err(S3Error::invalid_argument(format!(
                "Invalid session mode {other:?}"
            )));
        }
    };
    let ttl = state.config.session_ttl;
    let session = Session {
        bucket: ctx.bucket.clone(),
        secret: random_string(
            40,
            b"ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/",
        ),
        token: base64::engine::general_purpose::STANDARD.encode(rand::random::<[u8; 48]>()),
        expires: Instant::now() + ttl,
        expires_wall: SystemTime::now() + ttl,
        read_only,
    };
    let access_key = format!(
        "ASIA{}",
        random_string(16, b"ABCDEFGHIJKLMNOPQRSTUVWXYZ234567")
    );
    let mut out = format!("{HEADER}<CreateSessionResult xmlns=\"{NS}\"><Credentials>");
    el(&mut out, "SessionToken", &session.token);
    el(&mut out, "SecretAccessKey", &session.secret);
    el(&mut out, "AccessKeyId", &access_key);
    el(&mut out, "Expiration", &xml::iso8601(session.expires_wall));
    out.push_str("</Credentials></CreateSessionResult>");
    {
        let mut sessions = state.store.sessions();
        // Forget sessions long dead so the table stays bounded.
        let horizon = Instant::now() - ttl.max(std::time::Duration::from_secs(600));
        sessions.retain(|_, s| s.expires > horizon);
        sessions.insert(access_key, session);
    }
    Ok(xml_response(out))
}

pub fn head_bucket(state: &Arc<State>, ctx: &Ctx) -> Answer {
    let buckets = state.store.buckets();
    let b = buckets
        .get(&ctx.bucket)
        .ok_or_else(S3Error::no_such_bucket)?;
    let mut r = respond(200, ResponseBody::empty());
    set_header(&mut r, "x-amz-bucket-region", &state.config.region);
    if b.directory {
        set_header(&mut r, "x-amz-bucket-location-type", "AvailabilityZone");
        let az = b
            .name
            .trim_end_matches("--x-s3")
            .rsplit("--")
            .next()
            .unwrap_or("")
            .to_string();
        set_header(&mut r, "x-amz-bucket-location-name", &az);
    }
    Ok(r)
}

pub fn create_bucket(state: &Arc<State>, ctx: &Ctx) -> Answer {
    if ctx.principal != crate::server::Principal::Root {
        return Err(S3Error::access_denied(
            "CreateBucket needs long-term credentials",
        ));
    }
    state.store.create_bucket(&ctx.bucket)?;
    let mut r = respond(200, ResponseBody::empty());
    set_header(&mut r, "location", &format!("/{}", ctx.bucket));
    Ok(r)
}

pub fn delete_bucket(state: &Arc<State>, ctx: &Ctx) -> Answer {
    state.store.delete_bucket(&ctx.bucket)?;
    Ok(respond(204, ResponseBody::empty()))
}

pub fn location(state: &Arc<State>, ctx: &Ctx) -> Answer {
    if !state.store.buckets().contains_key(&ctx.bucket) {
        return Err(S3Error::no_such_bucket());
    }
    // us-east-1 is written as an empty constraint, as S3 does.
    let region = if state.config.region == "us-east-1" {
        ""
    } else {
        &state.config.region
    };
    Ok(xml_response(format!(
        "{HEADER}<LocationConstraint xmlns=\"{NS}\">{}</LocationConstraint>",
        xml::escape(region)
    )))
}

pub fn list_buckets(state: &Arc<State>) -> Answer {
    let buckets = state.store.buckets();
    let mut names: Vec<_> = buckets
        .values()
        .filter(|b| !b.directory)
        .map(|b| (b.name.clone(), b.created))
        .collect();
    names.sort();
    let mut out = format!(
        "{HEADER}<ListAllMyBucketsResult xmlns=\"{NS}\"><Owner><ID>emulator</ID></Owner><Buckets>"
    );
    for (name, created) in names {
        out.push_str("<Bucket>");
        el(&mut out, "Name", &name);
        el(&mut out, "CreationDate", &xml::iso8601(created));
        out.push_str("</Bucket>");
    }
    out.push_str("</Buckets></ListAllMyBucketsResult>");
    Ok(xml_response(out))
}
