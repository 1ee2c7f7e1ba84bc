//! How every file Floodgate reads is read (rules, certificates, tokens,
//! overrides): the file's type is checked and its size bounded, so that a
//! FIFO, a device such as /dev/zero or a huge file can neither block nor
//! exhaust the server.

use std::path::Path;

/// Reads a file the server depends on: a regular file (after symlinks) of at
/// most `max` bytes, or an error that says what it is instead.
///
/// Never blocks on what is not a file: it is opened without waiting (a FIFO
/// with no writer opens at once), then refused by what `fstat` says it is
/// (FIFO, device, directory, socket). Never reads more than `max + 1` bytes,
/// whatever the size it claims (a file that grows while read, `/proc`).
pub fn read_file(path: &Path, max: usize) -> std::io::Result<Vec<u8>> {
    use std::io::Read;
    #[cfg(unix)]
    let file = {
        use std::os::unix::fs::OpenOptionsExt;
        std::fs::OpenOptions::new().read(true).custom_flags(libc::O_NONBLOCK | libc::O_NOCTTY).open(path)?
    };
    #[cfg(not(unix))]
    let file = std::fs::File::open(path)?;
    let meta = file.metadata()?;
    let kind = meta.file_type();
    if !kind.is_file() {
        return Err(std::io::Error::new(
            std::io::ErrorKind::InvalidInput,
            format!("is not a regular file but {}", describe(kind)),
        ));
    }
    // A regular file's size is known: one too large (a sparse 10 GiB) is
    // refused without reading it.
    if meta.len() > max as u64 {
        return Err(std::io::Error::new(
            std::io::ErrorKind::InvalidData,
            format!("is {} bytes, larger than {max}, the limit", meta.len()),
        ));
    }
    let mut bytes = Vec::new();
    file.take(max as u64 + 1).read_to_end(&mut bytes)?;
    if bytes.len() > max {
        return Err(std::io::Error::new(
            std::io::ErrorKind::InvalidData,
            format!("is larger than {max} bytes, the limit"),
        ));
    }
    Ok(bytes)
}

/// [`read_file`] as UTF-8 text.
pub fn read_text(path: &Path, max: usize) -> std::io::Result<String> {
    String::from_utf8(read_file(path, max)?)
        .map_err(|e| std::io::Error::new(std::io::ErrorKind::InvalidData, format!("is not UTF-8: {e}")))
}

fn describe(kind: std::fs::FileType) -> &'static str {
    #[cfg(unix)]
    {
        use std::os::unix::fs::FileTypeExt;
        if kind.is_fifo() {
            return "a FIFO";
        }
        if kind.is_char_device() {
            return "a character device";
        }
        if kind.is_block_device() {
            return "a block device";
        }
        if kind.is_socket() {
            return "a socket";
        }
    }
    if kind.is_dir() { "a directory" } else { "not a file" }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_a_regular_file_within_its_bound_is_read() {
        let dir = tempfile::tempdir().unwrap();
        let file = dir.path().join("rules.yaml");
        std::fs::write(&file, "0123456789").unwrap();
        assert_eq!(read_text(&file, 10).unwrap(), "0123456789");
        let e = read_text(&file, 9).unwrap_err().to_string();
        assert!(e.contains("is 10 bytes, larger than 9"), "{e}");

        // A FIFO with no writer: refused at once, not waited on.
        let fifo = dir.path().join("fifo.yaml");
        let made = std::process::Command::new("mkfifo").arg(&fifo).status().unwrap();
        assert!(made.success(), "mkfifo failed");
        let e = read_text(&fifo, 10).unwrap_err().to_string();
        assert!(e.contains("a FIFO"), "{e}");

        // An endless device through a symlink, and a directory.
        let zero = dir.path().join("zero.yaml");
        std::os::unix::fs::symlink("/dev/zero", &zero).unwrap();
        let e = read_text(&zero, 10).unwrap_err().to_string();
        assert!(e.contains("a character device"), "{e}");
        let e = read_text(dir.path(), 10).unwrap_err().to_string();
        assert!(e.contains("a directory"), "{e}");

        // Not UTF-8.
        std::fs::write(&file, [0xff, 0xfe]).unwrap();
        assert!(read_text(&file, 10).unwrap_err().to_string().contains("not UTF-8"));
    }
}
