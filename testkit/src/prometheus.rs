//! A real Prometheus server (and Pushgateway) for the tests of `/metrics`: Debian's
//! `prometheus` and `prometheus-pushgateway` packages, started on free loopback ports with a
//! throw-away storage folder, asked through their HTTP APIs, and killed when the test ends.
//!
//! Where a binary is absent, [`Prometheus::start`] and [`Pushgateway::start`] say so in one
//! `skipped:` line and return `None`, unless [`REQUIRE_PROMETHEUS_ENV`]`=1` (which CI sets
//! where it installed the packages): then the test fails. Every wait polls with a deadline.

use std::collections::BTreeMap;
use std::io::{Read, Write};
use std::net::{TcpListener, TcpStream};
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use serde_json::Value;

use crate::skip_notice;

/// The environment variable that makes an absent Prometheus or Pushgateway a failure.
pub const REQUIRE_PROMETHEUS_ENV: &str = "VRAMSCOPE_REQUIRE_PROMETHEUS";

/// A free TCP port on 127.0.0.1 (bound, read, and released at once).
pub fn free_port() -> u16 {
    TcpListener::bind("127.0.0.1:0")
        .and_then(|l| l.local_addr())
        .expect("a free loopback port")
        .port()
}

/// Whether `binary` is on PATH; where it is not, says the test skipped (or fails it where
/// [`REQUIRE_PROMETHEUS_ENV`] is set).
fn present(binary: &str, package: &str) -> bool {
    let found = std::env::var_os("PATH")
        .is_some_and(|paths| std::env::split_paths(&paths).any(|dir| dir.join(binary).is_file()));
    if !found {
        assert!(
            std::env::var(REQUIRE_PROMETHEUS_ENV).as_deref() != Ok("1"),
            "{binary} not found and {REQUIRE_PROMETHEUS_ENV}=1 (apt-get install {package})"
        );
        skip_notice(&format!(
            "{binary} not found: not checked against a real {binary} (apt-get install {package})"
        ));
    }
    found
}

/// Percent-encodes `text` for a URL's query.
pub fn url_encode(text: &str) -> String {
    text.bytes()
        .map(|b| match b {
            b'A'..=b'Z' | b'a'..=b'z' | b'0'..=b'9' | b'-' | b'_' | b'.' | b'~' => {
                (b as char).to_string()
            }
            _ => format!("%{b:02X}"),
        })
        .collect()
}

/// `GET path` at `addr`: the status code and the body; `None` when the connection fails.
pub fn get(addr: &str, path: &str) -> Option<(u16, String)> {
    let mut conn = TcpStream::connect(addr).ok()?;
    conn.set_read_timeout(Some(Duration::from_secs(10))).ok()?;
    write!(
        conn,
        "GET {path} HTTP/1.1\r\nHost: {addr}\r\nConnection: close\r\n\r\n"
    )
    .ok()?;
    let mut response = Vec::new();
    conn.read_to_end(&mut response).ok()?;
    let response = String::from_utf8_lossy(&response).into_owned();
    let (head, body) = response.split_once("\r\n\r\n")?;
    let code = head.split(' ').nth(1)?.parse().ok()?;
    let body = if head
        .to_ascii_lowercase()
        .contains("transfer-encoding: chunked")
    {
        dechunk(body)
    } else {
        body.to_string()
    };
    Some((code, body))
}

/// The body of a chunked response.
fn dechunk(mut body: &str) -> String {
    let mut out = String::new();
    while let Some((size, rest)) = body.split_once("\r\n") {
        let Ok(size) = usize::from_str_radix(size.trim(), 16) else {
            break;
        };
        if size == 0 || rest.len() < size {
            break;
        }
        out.push_str(&rest[..size]);
        body = rest[size..].trim_start_matches("\r\n");
    }
    out
}

/// Polls `check` every 100 ms until it gives a value, failing the test with `what` after
/// `timeout`.
pub fn poll<T>(what: &str, timeout: Duration, mut check: impl FnMut() -> Option<T>) -> T {
    let deadline = Instant::now() + timeout;
    loop {
        if let Some(value) = check() {
            return value;
        }
        assert!(Instant::now() < deadline, "{what}: not within {timeout:?}");
        std::thread::sleep(Duration::from_millis(100));
    }
}

/// A child process killed (and its folder removed) when dropped.
struct Running {
    child: Child,
    dir: PathBuf,
}

impl Drop for Running {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

impl Running {
    /// Starts `program` with `args` in the scratch folder `dir` (its standard error to
    /// `dir/log`) and waits until it answers on `addr`.
    fn launch(program: &str, args: &[String], dir: PathBuf, addr: &str) -> Running {
        let log = std::fs::File::create(dir.join("log")).expect("a log file");
        let child = Command::new(program)
            .args(args)
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(log)
            .spawn()
            .unwrap_or_else(|e| panic!("{program} starts: {e}"));
        let mut running = Running { child, dir };
        wait_ready(addr, &mut running, program);
        running
    }
}

/// A folder of its own for one server.
fn scratch(name: &str) -> PathBuf {
    let dir = std::env::temp_dir().join(format!(
        "vramscope-{name}-{}-{}",
        std::process::id(),
        free_port()
    ));
    std::fs::create_dir_all(&dir).expect("a scratch folder");
    dir
}

/// Waits until `addr` answers `GET /-/ready` with 200 (both servers have it), or the child
/// exits (its standard error then fails the test).
fn wait_ready(addr: &str, running: &mut Running, name: &str) {
    poll(
        &format!("{name} ready on {addr}"),
        Duration::from_secs(60),
        || {
            if let Ok(Some(status)) = running.child.try_wait() {
                let log = std::fs::read_to_string(running.dir.join("log")).unwrap_or_default();
                panic!("{name} exited ({status}):\n{log}");
            }
            matches!(get(addr, "/-/ready"), Some((200, _))).then_some(())
        },
    );
}

/// A Prometheus server scraping some targets every second.
pub struct Prometheus {
    addr: String,
    _running: Running,
}

impl Prometheus {
    /// Starts Prometheus scraping each `(job, HOST:PORT)` of `targets` at `/metrics` every
    /// second; `None` (with its one line) where the binary is absent.
    pub fn start(targets: &[(&str, &str)]) -> Option<Prometheus> {
        if !present("prometheus", "prometheus") {
            return None;
        }
        let dir = scratch("prometheus");
        let mut config =
            "global:\n  scrape_interval: 1s\n  scrape_timeout: 900ms\nscrape_configs:\n"
                .to_string();
        for (job, target) in targets {
            config.push_str(&format!(
                "  - job_name: {job}\n    static_configs:\n      - targets: ['{target}']\n"
            ));
        }
        std::fs::write(dir.join("prometheus.yml"), config).expect("the config written");
        let addr = format!("127.0.0.1:{}", free_port());
        let args = [
            format!("--config.file={}", dir.join("prometheus.yml").display()),
            format!("--storage.tsdb.path={}", dir.join("data").display()),
            format!("--web.listen-address={addr}"),
            "--log.level=warn".to_string(),
        ];
        let running = Running::launch("prometheus", &args, dir, &addr);
        Some(Prometheus {
            addr,
            _running: running,
        })
    }

    /// The address of its HTTP API.
    pub fn addr(&self) -> &str {
        &self.addr
    }

    /// `GET /api/v1/{path}` (its query already encoded): the answer's `data`, failing the
    /// test on an error status.
    pub fn api(&self, path: &str) -> Value {
        let (code, body) = get(&self.addr, &format!("/api/v1/{path}"))
            .unwrap_or_else(|| panic!("prometheus did not answer /api/v1/{path}"));
        let answer: Value = serde_json::from_str(&body).unwrap_or_else(|e| {
            panic!("/api/v1/{path} answered {code} with no JSON ({e}): {body}")
        });
        assert_eq!(
            answer["status"], "success",
            "/api/v1/{path} answered {code}: {body}"
        );
        answer["data"].clone()
    }

    /// The instant query `promql` now: its result vector, as `(labels, value)`.
    pub fn query(&self, promql: &str) -> Vec<(Value, f64)> {
        let data = self.api(&format!("query?query={}", url_encode(promql)));
        data["result"]
            .as_array()
            .map(|results| {
                results
                    .iter()
                    .map(|r| {
                        let value = r["value"][1]
                            .as_str()
                            .and_then(|v| v.parse().ok())
                            .unwrap_or(f64::NAN);
                        (r["metric"].clone(), value)
                    })
                    .collect()
            })
            .unwrap_or_default()
    }

    /// Polls `promql` until its result satisfies `accept`; that result.
    pub fn wait_for(
        &self,
        promql: &str,
        timeout: Duration,
        accept: impl Fn(&[(Value, f64)]) -> bool,
    ) -> Vec<(Value, f64)> {
        poll(&format!("prometheus: {promql}"), timeout, || {
            let result = self.query(promql);
            accept(&result).then_some(result)
        })
    }

    /// The type of every metric the targets of `job` expose, as `(name, type)`, from the
    /// targets' metadata.
    pub fn metric_types(&self, job: &str) -> Vec<(String, String)> {
        let data = self.api(&format!(
            "targets/metadata?match_target={}",
            url_encode(&format!("{{job=\"{job}\"}}"))
        ));
        let mut types: Vec<(String, String)> = data
            .as_array()
            .map(|all| {
                all.iter()
                    .map(|m| {
                        (
                            m["metric"].as_str().unwrap_or("").to_string(),
                            m["type"].as_str().unwrap_or("").to_string(),
                        )
                    })
                    .collect()
            })
            .unwrap_or_default();
        types.sort();
        types.dedup();
        types
    }
}

/// The `# TYPE` of every metric family in a `/metrics` text, by name.
pub fn served_types(text: &str) -> BTreeMap<String, String> {
    text.lines()
        .filter_map(|l| l.strip_prefix("# TYPE "))
        .filter_map(|l| l.split_once(' '))
        .map(|(name, kind)| (name.to_string(), kind.to_string()))
        .collect()
}

impl Prometheus {
    /// Asserts that Prometheus has every `vramscope_` family of the `/metrics` text `served`
    /// from the targets of `job`, with the type it was served with, and a series of each.
    pub fn assert_has_every_family(&self, job: &str, served: &str) {
        let served = served_types(served);
        let seen: BTreeMap<String, String> = self
            .metric_types(job)
            .into_iter()
            .filter(|(name, _)| name.starts_with("vramscope_"))
            .collect();
        assert_eq!(seen, served, "Prometheus's metadata and the served types");
        for name in served.keys() {
            let found = self.query(&format!("{name}{{job=\"{job}\"}}"));
            assert!(!found.is_empty(), "no {name} in Prometheus");
        }
    }
}

/// A Prometheus Pushgateway.
pub struct Pushgateway {
    addr: String,
    _running: Running,
}

impl Pushgateway {
    /// Starts a Pushgateway on a free loopback port; `None` (with its one line) where the
    /// binary is absent.
    pub fn start() -> Option<Pushgateway> {
        if !present("prometheus-pushgateway", "prometheus-pushgateway") {
            return None;
        }
        let dir = scratch("pushgateway");
        let addr = format!("127.0.0.1:{}", free_port());
        let args = [
            format!("--web.listen-address={addr}"),
            "--log.level=warn".to_string(),
        ];
        let running = Running::launch("prometheus-pushgateway", &args, dir, &addr);
        Some(Pushgateway {
            addr,
            _running: running,
        })
    }

    /// The address it listens on, `HOST:PORT`.
    pub fn addr(&self) -> &str {
        &self.addr
    }

    /// What it serves on `/metrics` now: the groups pushed, with their `job` labels.
    pub fn metrics(&self) -> String {
        match get(&self.addr, "/metrics") {
            Some((200, body)) => body,
            other => panic!("the pushgateway's /metrics answered {other:?}"),
        }
    }
}
