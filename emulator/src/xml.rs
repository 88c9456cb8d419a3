//! The few XML documents the emulator reads and writes. Answers are small and fixed in shape, so they are
//! written with `format!` and escaping; request bodies are parsed with quick-xml.

use quick_xml::Reader;
use quick_xml::events::Event;

use crate::error::S3Error;

pub const HEADER: &str = "<?xml version=\"1.0\" encoding=\"UTF-8\"?>\n";
pub const NS: &str = "http://s3.amazonaws.com/doc/2006-03-01/";

pub fn escape(s: &str) -> String {
    quick_xml::escape::escape(s).into_owned()
}

/// One `<Part>` of a CompleteMultipartUpload request.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct CompletedPart {
    pub part_number: u32,
    pub etag: String,
    /// `(algorithm, value)` pairs such as `("crc32c", "base64")`.
    pub checksums: Vec<(String, String)>,
}

/// Parses `<CompleteMultipartUpload><Part><PartNumber/><ETag/>...</Part>...</CompleteMultipartUpload>`.
pub fn parse_complete(body: &[u8]) -> Result<Vec<CompletedPart>, S3Error> {
    let malformed = |why: String| {
        S3Error::new(
            400,
            "MalformedXML",
            format!(
                "The XML you provided was not well-formed or did not validate against our published schema: {why}"
            ),
        )
    };
    let mut reader = Reader::from_reader(body);
    reader.config_mut().trim_text(true);
    let mut parts = Vec::new();
    let mut current: Option<CompletedPart> = None;
    let mut element = String::new();
    let mut saw_root = false;
    let mut buf = Vec::new();
    let mut text_buf = String::new();
    loop {
        match reader.read_event_into(&mut buf) {
            Ok(Event::Start(e)) => {
                let name = String::from_utf8_lossy(e.local_name().as_ref()).into_owned();
                match name.as_str() {
                    "CompleteMultipartUpload" => saw_root = true,
                    "Part" => current = Some(CompletedPart::default()),
                    _ => {}
                }
                text_buf.clear();
                element = name;
            }
            Ok(Event::Text(t)) => {
                let text = t.decode().map_err(|e| malformed(e.to_string()))?;
                text_buf.push_str(&text);
            }
            Ok(Event::GeneralRef(r)) => {
                // quick-xml reports entity references (`&quot;` in ETags) as their own events.
                let name = r.decode().map_err(|e| malformed(e.to_string()))?;
                let resolved = quick_xml::escape::unescape(&format!("&{name};"))
                    .map_err(|e| malformed(e.to_string()))?
                    .into_owned();
                text_buf.push_str(&resolved);
            }
            Ok(Event::End(e)) => {
                let text = std::mem::take(&mut text_buf);
                if let Some(part) = &mut current {
                    match element.as_str() {
                        "PartNumber" => {
                            part.part_number = text
                                .trim()
                                .parse()
                                .map_err(|_| malformed(format!("PartNumber {text:?}")))?
                        }
                        "ETag" => part.etag = text.trim().to_string(),
                        other if other.starts_with("Checksum") => part.checksums.push((
                            other["Checksum".len()..].to_ascii_lowercase(),
                            text.trim().to_string(),
                        )),
                        _ => {}
                    }
                }
                if e.local_name().as_ref() == b"Part" {
                    let part = current
                        .take()
                        .ok_or_else(|| malformed("stray </Part>".into()))?;
                    if part.part_number == 0 || part.etag.is_empty() {
                        return Err(malformed("a Part needs PartNumber and ETag".into()));
                    }
                    parts.push(part);
                }
                element.clear();
            }
            Ok(Event::Eof) => break,
            Ok(_) => {}
            Err(e) => return Err(malformed(e.to_string())),
        }
        buf.clear();
    }
    if !saw_root {
        return Err(malformed("no CompleteMultipartUpload element".into()));
    }
    if parts.is_empty() {
        return Err(malformed("You must specify at least one part".into()));
    }
    Ok(parts)
}

/// Writes `<Name>value</Name>` with escaping.
pub fn el(out: &mut String, name: &str, value: &str) {
    out.push('<');
    out.push_str(name);
    out.push('>');
    out.push_str(&escape(value));
    out.push_str("</");
    out.push_str(name);
    out.push('>');
}

/// RFC 3339 with milliseconds, as S3 writes timestamps in XML.
pub fn iso8601(t: std::time::SystemTime) -> String {
    let t = time::OffsetDateTime::from(t);
    // S3 keeps whole seconds: its listings say `.000Z`, as its `Last-Modified` headers say seconds. A listing
    // with the milliseconds would show a client a time that a HEAD of the same object contradicts.
    let format =
        time::macros::format_description!("[year]-[month]-[day]T[hour]:[minute]:[second].000Z");
    t.format(format).unwrap_or_default()
}

/// RFC 7231 date, as S3 writes `Last-Modified`.
pub fn http_date(t: std::time::SystemTime) -> String {
    let t = time::OffsetDateTime::from(t);
    let format = time::macros::format_description!(
        "[weekday repr:short], [day] [month repr:short] [year] [hour]:[minute]:[second] GMT"
    );
    t.format(format).unwrap_or_default()
}

pub fn parse_http_date(s: &str) -> Option<std::time::SystemTime> {
    let format = time::macros::format_description!(
        "[weekday repr:short], [day] [month repr:short] [year] [hour]:[minute]:[second] GMT"
    );
    time::PrimitiveDateTime::parse(s.trim(), format)
        .ok()
        .map(|t| t.assume_utc().into())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_complete_with_checksums() {
        let body = br#"<?xml version="1.0"?><CompleteMultipartUpload xmlns="http://s3.amazonaws.com/doc/2006-03-01/">
            <Part><ETag>"a&quot;b"</ETag><PartNumber>1</PartNumber><ChecksumCRC32C>AAAAAA==</ChecksumCRC32C></Part>
            <Part><PartNumber>2</PartNumber><ETag>"c"</ETag></Part></CompleteMultipartUpload>"#;
        let parts = parse_complete(body).unwrap();
        assert_eq!(parts.len(), 2);
        assert_eq!(parts[0].part_number, 1);
        assert_eq!(parts[0].etag, "\"a\"b\"");
        assert_eq!(
            parts[0].checksums,
            vec![("crc32c".to_string(), "AAAAAA==".to_string())]
        );
        assert_eq!(parts[1].etag, "\"c\"");
    }

    #[test]
    fn refuses_garbage() {
        assert!(parse_complete(b"<Nope/>").is_err());
        assert!(parse_complete(b"<CompleteMultipartUpload></CompleteMultipartUpload>").is_err());
    }

    #[test]
    fn dates_round_trip() {
        let t = std::time::UNIX_EPOCH + std::time::Duration::from_secs(1_700_000_000);
        assert_eq!(http_date(t), "Tue, 14 Nov 2023 22:13:20 GMT");
        assert_eq!(parse_http_date(&http_date(t)), Some(t));
        assert_eq!(iso8601(t), "2023-11-14T22:13:20.000Z");
        // Whole seconds, as the header: a listing must not show a time its HEAD contradicts.
        let later = t + std::time::Duration::from_millis(830);
        assert_eq!(iso8601(later), "2023-11-14T22:13:20.000Z");
        assert_eq!(http_date(later), http_date(t));
    }
}
