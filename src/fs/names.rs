//! Which keys can be shown as file names. S3 keys may contain anything; a directory entry may not.

/// Longest name most Linux file systems (and our statfs) allow.
pub const NAME_MAX: usize = 255;

/// True if `name` can be a directory entry: not empty, not `.`/`..`, no `/` or NUL, at most 255 bytes.
pub fn is_valid_name(name: &str) -> bool {
    !name.is_empty()
        && name != "."
        && name != ".."
        && name.len() <= NAME_MAX
        && !name.contains(['/', '\0'])
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
}
