//! The syslog sink: one RFC 3164 datagram per event to the local syslog socket, the format glibc's
//! `syslog(3)` sends (`<PRI>Mmm dd hh:mm:ss expressfs[PID]: message`), which rsyslog, syslog-ng and
//! journald all parse (journald takes the identifier and the priority from it).

use std::io::Write;
use std::os::unix::net::UnixDatagram;
use std::path::PathBuf;

use tracing::{Level, Metadata};
use tracing_subscriber::fmt::MakeWriter;

/// Overrides `/dev/log` (tests bind their own socket; a chroot may keep it elsewhere).
pub const SOCKET_ENV: &str = "EXPRESSFS_SYSLOG_SOCKET";

/// LOG_DAEMON, as for any system daemon.
const FACILITY: u8 = 3;

/// Longer messages are cut: a datagram must fit the socket's buffer, and no log line needs more.
const MAX_MESSAGE: usize = 16 * 1024;

pub struct Sink {
    socket: UnixDatagram,
    path: PathBuf,
    pid: u32,
}

impl Sink {
    /// None when there is no socket to send to.
    pub fn open() -> Option<Sink> {
        let path = std::env::var_os(SOCKET_ENV)
            .map(PathBuf::from)
            .unwrap_or_else(|| PathBuf::from("/dev/log"));
        use std::os::unix::fs::FileTypeExt;
        if !std::fs::metadata(&path).ok()?.file_type().is_socket() {
            return None;
        }
        let socket = UnixDatagram::unbound().ok()?;
        // A full receiver must not stall a FUSE thread that logs: the line is dropped instead.
        socket.set_nonblocking(true).ok()?;
        Some(Sink {
            socket,
            path,
            pid: std::process::id(),
        })
    }

    /// Sent to the path each time rather than connected once, so a restarted syslog daemon (a new socket
    /// at the same path) keeps receiving.
    fn send(&self, severity: u8, message: &[u8]) {
        let mut datagram = format!(
            "<{}>{} expressfs[{}]: ",
            FACILITY * 8 + severity,
            timestamp(),
            self.pid
        )
        .into_bytes();
        let mut message = message;
        while let Some((b'\n' | b'\r', rest)) = message.split_last() {
            message = rest;
        }
        datagram.extend_from_slice(&message[..message.len().min(MAX_MESSAGE)]);
        let _ = self.socket.send_to(&datagram, &self.path);
    }
}

impl Sink {
    fn line(&self, level: Level) -> Line<'_> {
        Line {
            sink: self,
            severity: severity(level),
            text: Vec::new(),
        }
    }
}

/// syslog severities: err, warning, info, debug (trace has none of its own).
pub fn severity(level: Level) -> u8 {
    match level {
        Level::ERROR => 3,
        Level::WARN => 4,
        Level::INFO => 6,
        _ => 7,
    }
}

const MONTHS: [&str; 12] = [
    "Jan", "Feb", "Mar", "Apr", "May", "Jun", "Jul", "Aug", "Sep", "Oct", "Nov", "Dec",
];

/// Local time as RFC 3164 writes it (`Nov  5 09:03:07`).
fn timestamp() -> String {
    // SAFETY: time(NULL) only reads the clock; localtime_r writes into our zeroed tm and is thread-safe.
    let tm = unsafe {
        let now = libc::time(std::ptr::null_mut());
        let mut tm: libc::tm = std::mem::zeroed();
        libc::localtime_r(&now, &mut tm);
        tm
    };
    format!(
        "{} {:>2} {:02}:{:02}:{:02}",
        MONTHS[tm.tm_mon.clamp(0, 11) as usize],
        tm.tm_mday,
        tm.tm_hour,
        tm.tm_min,
        tm.tm_sec
    )
}

/// One event's text, sent when the formatter is done with it (it writes an event in one or more pieces).
pub struct Line<'a> {
    sink: &'a Sink,
    severity: u8,
    text: Vec<u8>,
}

impl Write for Line<'_> {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        self.text.extend_from_slice(buf);
        Ok(buf.len())
    }

    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

impl Drop for Line<'_> {
    fn drop(&mut self) {
        if !self.text.is_empty() {
            self.sink.send(self.severity, &self.text);
        }
    }
}

impl<'a> MakeWriter<'a> for Sink {
    type Writer = Line<'a>;

    fn make_writer(&'a self) -> Line<'a> {
        self.line(Level::INFO)
    }

    fn make_writer_for(&'a self, meta: &Metadata<'_>) -> Line<'a> {
        self.line(*meta.level())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn levels_map_to_syslog_severities() {
        assert_eq!(severity(Level::ERROR), 3);
        assert_eq!(severity(Level::WARN), 4);
        assert_eq!(severity(Level::INFO), 6);
        assert_eq!(severity(Level::DEBUG), 7);
        assert_eq!(severity(Level::TRACE), 7);
    }

    #[test]
    fn one_datagram_per_line_with_priority_identifier_and_pid() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("log");
        let receiver = UnixDatagram::bind(&path).unwrap();
        let sink = Sink {
            socket: UnixDatagram::unbound().unwrap(),
            path,
            pid: 42,
        };
        {
            let mut line = sink.line(Level::WARN);
            write!(line, "first half, ").unwrap();
            writeln!(line, "second half").unwrap();
        }
        let mut buf = [0u8; 256];
        let n = receiver.recv(&mut buf).unwrap();
        let got = std::str::from_utf8(&buf[..n]).unwrap();
        assert!(got.starts_with("<28>"), "{got}");
        assert!(
            got.ends_with(" expressfs[42]: first half, second half"),
            "{got}"
        );
        // `<28>Mmm dd hh:mm:ss ` is 4 + 16 characters.
        assert_eq!(&got[4 + 15..4 + 16], " ", "{got}");
        assert!(MONTHS.contains(&&got[4..7]), "{got}");
    }
}
