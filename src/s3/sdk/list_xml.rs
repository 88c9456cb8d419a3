//! A ListObjectsV2 answer read with quick-xml, for the listings `direct.rs` sends.
//!
//! Only what a [`ListPage`] holds is kept: each object's key, size, ETag and date, the common prefixes, and
//! what says whether more follows. Text is taken as the SDK's parser takes it: entities and character
//! references resolved, line ends left as they are (a key may hold a carriage return). A document that is not
//! a whole `ListBucketResult` is refused, never read as a short listing.

use std::time::SystemTime;

use quick_xml::Reader;
use quick_xml::events::{BytesRef, Event};

use super::{ListedEnd, checked_page};
use crate::s3::{ClientError, ListPage, ObjectInfo, UserMetadata};

/// Where the parser is: the elements that matter, by depth.
#[derive(Clone, Copy, PartialEq, Eq)]
enum At {
    /// `ListBucketResult` itself, or an element of it we skip.
    Root,
    Contents,
    CommonPrefixes,
}

/// The element names from the root down. Each depth keeps its buffer from one element to the next, so a page of
/// 1,000 entries costs no allocation per element.
#[derive(Default)]
struct ElementPath {
    names: Vec<Vec<u8>>,
    depth: usize,
}

impl ElementPath {
    fn push(&mut self, name: &[u8]) {
        if self.depth == self.names.len() {
            self.names.push(Vec::new());
        }
        let slot = &mut self.names[self.depth];
        slot.clear();
        slot.extend_from_slice(name);
        self.depth += 1;
    }

    fn pop(&mut self) {
        self.depth = self.depth.saturating_sub(1);
    }

    fn len(&self) -> usize {
        self.depth
    }

    fn is_empty(&self) -> bool {
        self.depth == 0
    }

    /// The innermost element's name; empty at the root.
    fn last(&self) -> &[u8] {
        self.depth.checked_sub(1).map_or(&[], |i| &self.names[i])
    }
}

/// Entries a page is made room for when its KeyCount comes before them (as S3 and the emulator send it): at
/// most what one page may hold, whatever a broken answer claims.
const MOST_KEYS_PER_PAGE: usize = 1000;

#[derive(Default)]
struct Entry {
    key: Option<String>,
    size: u64,
    etag: String,
    last_modified: Option<SystemTime>,
}

pub(super) fn parse_list_page(body: &[u8]) -> Result<ListPage, ClientError> {
    let malformed = |what: String| ClientError::Malformed(format!("ListObjectsV2 answer: {what}"));
    let mut reader = Reader::from_reader(body);
    // Element names from the root down, and the text of the innermost one so far.
    let mut path = ElementPath::default();
    let mut text = String::new();
    let mut at = At::Root;
    let mut entry = Entry::default();
    let mut objects = Vec::new();
    let mut prefixes = Vec::new();
    let mut entries = 0usize;
    let mut end = PageEnd::default();
    let mut root_closed = false;
    loop {
        let event = reader
            .read_event()
            .map_err(|e| malformed(format!("not XML ({e})")))?;
        match event {
            Event::Start(e) => {
                if root_closed {
                    return Err(malformed("content after the root element".into()));
                }
                let local = e.local_name();
                let name = local.as_ref();
                if path.is_empty() && name != b"ListBucketResult" {
                    return Err(malformed(format!(
                        "root element {:?}, not ListBucketResult",
                        String::from_utf8_lossy(name)
                    )));
                }
                if path.len() == 1 {
                    at = match name {
                        b"Contents" => {
                            entry = Entry::default();
                            At::Contents
                        }
                        b"CommonPrefixes" => At::CommonPrefixes,
                        _ => At::Root,
                    };
                }
                path.push(name);
                text.clear();
            }
            Event::Empty(e) => {
                // `<Prefix/>`, `<NextContinuationToken/>`: an element with empty text.
                if path.is_empty() {
                    return Err(malformed("empty root element".into()));
                }
                let local = e.local_name();
                let name = local.as_ref();
                if path.len() == 1 {
                    // As the SDK reads them: an empty entry has no key, an empty prefix entry still counts.
                    match name {
                        b"Contents" => return Err(malformed("entry without a key".into())),
                        b"CommonPrefixes" => entries += 1,
                        _ => {}
                    }
                }
                text.clear();
                path.push(name);
                let done = element_ended(&path, at, "", &mut entry, &mut prefixes, &mut end);
                done.map_err(malformed)?;
                path.pop();
            }
            Event::Text(t) => text.push_str(&t.decode().map_err(|e| malformed(e.to_string()))?),
            Event::CData(c) => text.push_str(&c.decode().map_err(|e| malformed(e.to_string()))?),
            Event::GeneralRef(r) => text.push(resolve(&r).map_err(malformed)?),
            Event::End(_) => {
                element_ended(&path, at, &text, &mut entry, &mut prefixes, &mut end)
                    .map_err(malformed)?;
                if let (2, b"KeyCount", Some(count)) = (path.len(), path.last(), end.key_count) {
                    let expected = usize::try_from(count).unwrap_or(0).min(MOST_KEYS_PER_PAGE);
                    objects.reserve(expected.saturating_sub(objects.len()));
                }
                if path.len() == 2 {
                    match at {
                        At::Contents => {
                            let done = std::mem::take(&mut entry);
                            let key = done
                                .key
                                .ok_or_else(|| malformed("entry without a key".into()))?;
                            objects.push(ObjectInfo {
                                key,
                                size: done.size,
                                etag: done.etag,
                                last_modified: done.last_modified.unwrap_or(SystemTime::UNIX_EPOCH),
                                metadata: UserMetadata::new(),
                            });
                            entries += 1;
                        }
                        At::CommonPrefixes => entries += 1,
                        At::Root => {}
                    }
                    at = At::Root;
                }
                path.pop();
                if path.is_empty() {
                    root_closed = true;
                }
                text.clear();
            }
            Event::Eof => break,
            // Declaration, comments, processing instructions.
            _ => {}
        }
    }
    if !root_closed {
        return Err(malformed("cut short".into()));
    }
    checked_page(
        objects,
        prefixes,
        entries,
        ListedEnd {
            is_truncated: end.is_truncated,
            next_token: end.next_token.as_deref(),
            key_count: end.key_count,
        },
    )
}

/// What the answer says about itself (see [`ListedEnd`]).
#[derive(Default)]
struct PageEnd {
    is_truncated: Option<bool>,
    next_token: Option<String>,
    key_count: Option<i64>,
}

/// The element at the end of `path` closed with `text`: keeps what it says.
fn element_ended(
    path: &ElementPath,
    at: At,
    text: &str,
    entry: &mut Entry,
    prefixes: &mut Vec<String>,
    page: &mut PageEnd,
) -> Result<(), String> {
    match (path.len(), at, path.last()) {
        (2, _, b"IsTruncated") => {
            page.is_truncated = Some(match text.trim() {
                "true" => true,
                "false" => false,
                other => return Err(format!("IsTruncated {other:?}")),
            });
        }
        (2, _, b"NextContinuationToken") => page.next_token = Some(text.to_string()),
        (2, _, b"KeyCount") => {
            page.key_count = Some(
                text.trim()
                    .parse()
                    .map_err(|_| format!("KeyCount {text:?}"))?,
            );
        }
        (3, At::Contents, b"Key") => entry.key = Some(text.to_string()),
        (3, At::Contents, b"Size") => {
            entry.size = text.trim().parse().map_err(|_| format!("Size {text:?}"))?;
        }
        (3, At::Contents, b"ETag") => entry.etag = text.to_string(),
        (3, At::Contents, b"LastModified") => {
            let date = aws_smithy_types::DateTime::from_str(
                text.trim(),
                aws_smithy_types::date_time::Format::DateTime,
            )
            .ok()
            .and_then(|d| SystemTime::try_from(d).ok())
            .ok_or_else(|| format!("LastModified {text:?}"))?;
            entry.last_modified = Some(crate::s3::whole_seconds(date));
        }
        (3, At::CommonPrefixes, b"Prefix") => prefixes.push(text.to_string()),
        _ => {}
    }
    Ok(())
}

/// `&amp;` and the other four XML entities, and character references.
fn resolve(reference: &BytesRef<'_>) -> Result<char, String> {
    if let Some(c) = reference
        .resolve_char_ref()
        .map_err(|e| format!("bad character reference ({e})"))?
    {
        return Ok(c);
    }
    match reference.as_ref() {
        b"amp" => Ok('&'),
        b"lt" => Ok('<'),
        b"gt" => Ok('>'),
        b"quot" => Ok('"'),
        b"apos" => Ok('\''),
        other => Err(format!(
            "unknown entity &{};",
            String::from_utf8_lossy(other)
        )),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn page(inner: &str) -> Result<ListPage, ClientError> {
        parse_list_page(
            format!(
                "<?xml version=\"1.0\" encoding=\"UTF-8\"?>\n\
                 <ListBucketResult xmlns=\"http://s3.amazonaws.com/doc/2006-03-01/\">{inner}</ListBucketResult>"
            )
            .as_bytes(),
        )
    }

    #[test]
    fn a_page_gives_its_objects_prefixes_and_token() {
        let listed = page(
            "<Name>b</Name><Prefix>d/</Prefix><KeyCount>3</KeyCount><MaxKeys>1000</MaxKeys>\
             <Delimiter>/</Delimiter><IsTruncated>true</IsTruncated>\
             <Contents><Key>d/a &amp; b&#13;&#x20AC;</Key><LastModified>2026-11-26T08:00:01.500Z</LastModified>\
             <ETag>&quot;abc&quot;</ETag><ChecksumAlgorithm>CRC32C</ChecksumAlgorithm><Size>12345678901</Size>\
             <StorageClass>EXPRESS_ONEZONE</StorageClass><Owner><ID>x</ID><Key>not this</Key></Owner></Contents>\
             <CommonPrefixes><Prefix>d/sub/</Prefix></CommonPrefixes>\
             <Contents><Key><![CDATA[d/<raw>]]></Key><Size>0</Size></Contents>\
             <NextContinuationToken>tok+/=</NextContinuationToken>",
        )
        .unwrap();
        assert_eq!(listed.objects.len(), 2);
        let first = &listed.objects[0];
        assert_eq!(first.key, "d/a & b\r\u{20ac}");
        assert_eq!(first.size, 12_345_678_901);
        assert_eq!(first.etag, "\"abc\"");
        let at = first
            .last_modified
            .duration_since(SystemTime::UNIX_EPOCH)
            .unwrap();
        // Listed with milliseconds, kept in whole seconds as a HEAD of the same object would say.
        assert_eq!(at.as_millis(), 1_795_680_001_000);
        assert_eq!(listed.objects[1].key, "d/<raw>");
        assert_eq!(listed.common_prefixes, vec!["d/sub/".to_string()]);
        assert_eq!(listed.next_continuation_token.as_deref(), Some("tok+/="));
    }

    #[test]
    fn the_last_page_and_an_empty_one() {
        let last = page(
            "<IsTruncated>false</IsTruncated><NextContinuationToken>x</NextContinuationToken>",
        )
        .unwrap();
        assert!(last.objects.is_empty() && last.next_continuation_token.is_none());
        let empty =
            page("<Prefix/><KeyCount>0</KeyCount><IsTruncated>false</IsTruncated>").unwrap();
        assert!(empty.objects.is_empty() && empty.common_prefixes.is_empty());
    }

    #[test]
    fn a_key_count_makes_room_for_one_page_at_most() {
        // The count first, as S3 sends it: the page reads as it would without it.
        let listed = page(
            "<KeyCount>3</KeyCount><IsTruncated>false</IsTruncated>\
             <Contents><Key>a</Key></Contents><Contents><Key>b</Key></Contents>\
             <CommonPrefixes><Prefix>c/</Prefix></CommonPrefixes>",
        )
        .unwrap();
        let keys: Vec<&str> = listed.objects.iter().map(|o| o.key.as_str()).collect();
        assert_eq!(keys, ["a", "b"]);
        assert_eq!(listed.common_prefixes, ["c/"]);
        // A count no page can hold is not allocated for (it would abort the daemon): the page is refused for
        // the mismatch, as before.
        let claimed = page(&format!(
            "<KeyCount>{}</KeyCount><IsTruncated>false</IsTruncated><Contents><Key>a</Key></Contents>",
            i64::MAX
        ));
        assert!(matches!(claimed, Err(ClientError::Malformed(_))));
    }

    #[test]
    fn answers_that_are_not_whole_listings_are_refused() {
        let refused = |doc: &str| {
            assert!(
                matches!(
                    parse_list_page(doc.as_bytes()),
                    Err(ClientError::Malformed(_))
                ),
                "{doc}"
            );
        };
        // Cut short, in the middle of an entry or after one.
        refused("<ListBucketResult><IsTruncated>false</IsTruncated><Contents><Key>a</Key>");
        refused(
            "<ListBucketResult><IsTruncated>false</IsTruncated><Contents><Key>a</Key></Contents>",
        );
        // No IsTruncated, truncated without a token, a count that does not match.
        refused("<ListBucketResult><Contents><Key>a</Key></Contents></ListBucketResult>");
        refused("<ListBucketResult><IsTruncated>true</IsTruncated></ListBucketResult>");
        refused(
            "<ListBucketResult><KeyCount>2</KeyCount><IsTruncated>false</IsTruncated></ListBucketResult>",
        );
        // An entry without a key; numbers and dates that do not parse; an unknown entity.
        refused(
            "<ListBucketResult><IsTruncated>false</IsTruncated><Contents><Size>1</Size></Contents></ListBucketResult>",
        );
        refused("<ListBucketResult><IsTruncated>false</IsTruncated><Contents/></ListBucketResult>");
        // An empty prefix entry counts towards KeyCount, as the SDK counts it.
        refused(
            "<ListBucketResult><KeyCount>0</KeyCount><IsTruncated>false</IsTruncated><CommonPrefixes/></ListBucketResult>",
        );
        refused(
            "<ListBucketResult><IsTruncated>false</IsTruncated><Contents><Key>a</Key><Size>-1</Size></Contents></ListBucketResult>",
        );
        refused(
            "<ListBucketResult><IsTruncated>false</IsTruncated><Contents><Key>a</Key><LastModified>yesterday</LastModified></Contents></ListBucketResult>",
        );
        refused("<ListBucketResult><IsTruncated>maybe</IsTruncated></ListBucketResult>");
        refused(
            "<ListBucketResult><IsTruncated>false</IsTruncated><Contents><Key>&nbsp;</Key></Contents></ListBucketResult>",
        );
        // Another document, mismatched tags, something after the root, nothing at all.
        refused("<Error><Code>InternalError</Code></Error>");
        refused("<ListBucketResult><IsTruncated>false</Key></ListBucketResult>");
        refused(
            "<ListBucketResult><IsTruncated>false</IsTruncated></ListBucketResult><ListBucketResult>",
        );
        refused("");
    }
}
