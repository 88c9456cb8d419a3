//! Keys to names and names to keys. S3 keys may contain anything; a directory entry may not, so every
//! conversion goes through here (and is fuzzed: see fuzz/ and the corpus replay test below).

/// Longest name most Linux file systems (and our statfs) allow.
pub const NAME_MAX: usize = 255;
/// S3's longest object key, in bytes of UTF-8.
pub const KEY_MAX: usize = 1024;

/// True if `name` can be a directory entry: not empty, not `.`/`..`, no `/` or NUL, at most 255 bytes.
pub fn is_valid_name(name: &str) -> bool {
    !name.is_empty()
        && name != "."
        && name != ".."
        && name.len() <= NAME_MAX
        && !name.contains(['/', '\0'])
}

/// The object key of file `name` in the directory whose prefix is `dir_prefix` ("" or ending in `/`).
pub fn file_key(dir_prefix: &str, name: &str) -> String {
    format!("{dir_prefix}{name}")
}

/// The prefix (ending in `/`) of directory `name` in the directory whose prefix is `dir_prefix`.
pub fn dir_prefix(dir_prefix: &str, name: &str) -> String {
    format!("{dir_prefix}{name}/")
}

/// What rclone `--links` appends to a symbolic link's name to make its object key; the object's body is the
/// link's target. A listing shows which names are links, with no request per entry.
pub const LINK_SUFFIX: &str = ".rclonelink";

/// The object key holding the symbolic link `name` in the directory whose prefix is `dir_prefix`.
pub fn link_key(dir_prefix: &str, name: &str) -> String {
    format!("{dir_prefix}{name}{LINK_SUFFIX}")
}

/// The link name an object's entry name stands for (`x.rclonelink` -> `x`), if it is a valid name itself.
pub fn link_name(object_name: &str) -> Option<&str> {
    object_name
        .strip_suffix(LINK_SUFFIX)
        .filter(|n| is_valid_name(n))
}

/// The entry name an object key from a listing of `dir_prefix` shows as, if it can be shown at all.
/// Keys outside the prefix, keys naming the prefix itself (`dir/` objects) and keys with names no directory
/// can hold are hidden.
pub fn name_of_object<'a>(dir_prefix: &str, key: &'a str) -> Option<&'a str> {
    key.strip_prefix(dir_prefix).filter(|n| is_valid_name(n))
}

/// The entry name a common prefix from a listing of `dir_prefix` shows as, if it can be shown.
pub fn name_of_common_prefix<'a>(dir_prefix: &str, prefix: &'a str) -> Option<&'a str> {
    prefix
        .strip_prefix(dir_prefix)
        .and_then(|p| p.strip_suffix('/'))
        .filter(|n| is_valid_name(n))
}

/// The invariants the fuzzer checks, for one directory prefix and one candidate key or name. Panics on a
/// violation; shared by the fuzz target and by the test that replays its corpus.
pub fn check_round_trips(dir: &str, candidate: &str) {
    // Directory prefixes are "" (the bucket root or the mount's --prefix) or end in '/'.
    let dir = if dir.is_empty() || dir.ends_with('/') {
        dir.to_string()
    } else {
        format!("{dir}/")
    };
    if is_valid_name(candidate) {
        let key = file_key(&dir, candidate);
        assert_eq!(name_of_object(&dir, &key), Some(candidate), "file {key:?}");
        let prefix = dir_prefix(&dir, candidate);
        assert_eq!(
            name_of_common_prefix(&dir, &prefix),
            Some(candidate),
            "dir {prefix:?}"
        );
        // A name never reaches into another directory.
        assert!(!candidate.contains('/'));
    }
    // Whatever a listing hands us, a shown name is valid and maps back to exactly that key.
    if let Some(name) = name_of_object(&dir, candidate) {
        assert!(is_valid_name(name));
        assert_eq!(file_key(&dir, name), candidate);
    }
    if let Some(name) = name_of_common_prefix(&dir, candidate) {
        assert!(is_valid_name(name));
        assert_eq!(dir_prefix(&dir, name), candidate);
    }
}

/// Splits fuzzer bytes into (directory prefix, candidate): the first NUL separates them when present.
pub fn split_fuzz_input(data: &[u8]) -> Option<(&str, &str)> {
    let text = std::str::from_utf8(data).ok()?;
    Some(text.split_once('\0').unwrap_or(("", text)))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn rejects_what_a_directory_cannot_hold() {
        assert!(is_valid_name("a.jpg"));
        assert!(is_valid_name("with space and ünïcode"));
        for bad in ["", ".", "..", "a/b", "nul\0", &"x".repeat(256)] {
            assert!(!is_valid_name(bad), "{bad:?}");
        }
        assert!(is_valid_name(&"x".repeat(255)));
    }

    #[test]
    fn listing_entries_map_to_names() {
        assert_eq!(name_of_object("a/", "a/b.jpg"), Some("b.jpg"));
        assert_eq!(
            name_of_object("a/", "a/"),
            None,
            "the directory marker itself"
        );
        assert_eq!(name_of_object("a/", "b/c"), None);
        assert_eq!(name_of_object("", "x/.."), None);
        assert_eq!(name_of_common_prefix("a/", "a/sub/"), Some("sub"));
        assert_eq!(name_of_common_prefix("a/", "a//"), None, "empty name");
        assert_eq!(name_of_common_prefix("a/", "a/../"), None);
        assert_eq!(file_key("a/", "b"), "a/b");
        assert_eq!(dir_prefix("", "b"), "b/");
    }

    #[test]
    fn links_are_objects_with_the_rclone_suffix() {
        assert_eq!(link_key("a/", "x"), "a/x.rclonelink");
        assert_eq!(link_name("x.rclonelink"), Some("x"));
        assert_eq!(link_name("x.rclonelink.rclonelink"), Some("x.rclonelink"));
        for not_a_link in [".rclonelink", "..rclonelink", "x.rclonelinks", "x"] {
            assert_eq!(link_name(not_a_link), None, "{not_a_link:?}");
        }
    }

    /// Replays every input the fuzzer kept (fuzz/corpus/names), so what it found stays fixed.
    #[test]
    fn fuzz_corpus_replays() {
        let dir = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("fuzz/corpus/names");
        let mut replayed = 0;
        for entry in std::fs::read_dir(&dir).expect("fuzz corpus is in the repository") {
            let data = std::fs::read(entry.unwrap().path()).unwrap();
            if let Some((dir, candidate)) = split_fuzz_input(&data) {
                check_round_trips(dir, candidate);
            }
            replayed += 1;
        }
        assert!(replayed >= 10, "corpus too small: {replayed}");
    }
}
