//! A script of tests/browser driving Chromium through playwright-core
//! (installed by scripts/test): it says one line per step on stdout and
//! waits for a line on stdin where the Rust side checks the server between
//! steps. Its errors go to the test's stderr.

use std::io::{BufRead, BufReader, Write};
use std::process::{Child, ChildStdin, Command, Stdio};
use std::sync::mpsc;
use std::time::Duration;

use super::{Floodgate, test_cache};

pub struct Browser {
    child: Child,
    stdin: Option<ChildStdin>,
    lines: mpsc::Receiver<String>,
}

impl Browser {
    /// Runs `node tests/browser/SCRIPT ARGS...`.
    pub fn start(script: &str, args: &[&str]) -> Browser {
        let mut child = Command::new("node")
            .arg(crate::repo_path("tests/browser").join(script))
            .args(args)
            .env("NODE_PATH", test_cache().join("npm/node_modules"))
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::inherit())
            .spawn()
            .expect("node (scripts/test installs it)");
        let (tx, lines) = mpsc::channel();
        let stdout = child.stdout.take().unwrap();
        std::thread::spawn(move || {
            for line in BufReader::new(stdout).lines().map_while(Result::ok) {
                let _ = tx.send(line);
            }
        });
        let stdin = child.stdin.take();
        Browser { child, stdin, lines }
    }

    /// The script's next line (90 s at most; else the server's logs).
    pub fn line(&self, fg: &Floodgate) -> String {
        match self.lines.recv_timeout(Duration::from_secs(90)) {
            Ok(line) => line,
            Err(_) => panic!("the browser stopped; server logs:\n{}", fg.logs()),
        }
    }

    /// Expects the next line to be `word`, maybe followed by a number: that number (0 if none).
    pub fn expect(&self, word: &str, fg: &Floodgate) -> u64 {
        let line = self.line(fg);
        let mut parts = line.split_whitespace();
        assert_eq!(parts.next(), Some(word), "{line}");
        parts.next().map_or(0, |n| n.parse().unwrap())
    }

    /// Lets the script go on to its next step.
    pub fn go_on(&mut self) {
        self.stdin.as_mut().expect("stdin open").write_all(b"CONTINUE\n").unwrap();
    }

    /// Waits for the script to end; it must succeed.
    pub fn finish(mut self) {
        drop(self.stdin.take());
        let status = self.child.wait().unwrap();
        assert!(status.success(), "{status:?}");
    }
}
