//! The status page in a real headless Chromium: a fleet with a fake-online agent (its business
//! calls get 429 while `/healthz` says 200), the caller's page rendered by the browser, the
//! broken agent shown out of rotation with its reason, and a screenshot kept under `target/`
//! (`status-page.png`, a CI artifact). Skipped, saying so, when Chromium is not installed.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use crate::support;

use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use agent_reach::reach::State;
use demo::{demo_policy, Fleet};
use support::*;
use testkit::Mode;

/// The broken agent (the fleet's second).
const BROKEN: &str = "coder-2";

/// The browser: `$CHROMIUM`, else the first of Debian's and others' names on the `PATH`.
fn chromium() -> Option<PathBuf> {
    if let Some(path) = std::env::var_os("CHROMIUM") {
        return Some(PathBuf::from(path));
    }
    let path = std::env::var_os("PATH")?;
    [
        "chromium",
        "chromium-browser",
        "google-chrome",
        "google-chrome-stable",
    ]
    .iter()
    .flat_map(|name| std::env::split_paths(&path).map(move |dir| dir.join(name)))
    .find(|p| p.is_file())
}

/// Where CI collects artifacts from: the target directory.
fn target_dir() -> PathBuf {
    std::env::var_os("CARGO_TARGET_DIR")
        .map(PathBuf::from)
        .unwrap_or_else(|| Path::new(env!("CARGO_MANIFEST_DIR")).join("target"))
}

/// Runs headless Chromium on `url` with `extra` arguments and a fresh profile; its stdout.
fn headless(chromium: &Path, url: &str, extra: &[&str]) -> String {
    let profile = std::env::temp_dir().join(format!(
        "agent-reach-chromium-{}-{}",
        std::process::id(),
        extra.len()
    ));
    let _ = std::fs::remove_dir_all(&profile);
    std::fs::create_dir_all(&profile).unwrap();
    let mut child = Command::new(chromium)
        .args([
            "--headless",
            "--no-sandbox",
            "--disable-gpu",
            "--disable-quic",
            "--no-first-run",
            "--disable-background-networking",
            "--disable-component-update",
            "--disable-sync",
            "--hide-scrollbars",
        ])
        .arg(format!("--user-data-dir={}", profile.display()))
        .args(extra)
        .arg(url)
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("chromium starts");
    let deadline = Instant::now() + Duration::from_secs(60);
    while child.try_wait().unwrap().is_none() {
        if Instant::now() > deadline {
            let _ = child.kill();
            let _ = child.wait();
            panic!("chromium did not finish within 60 s");
        }
        std::thread::sleep(Duration::from_millis(50));
    }
    let out = child.wait_with_output().unwrap();
    let _ = std::fs::remove_dir_all(&profile);
    assert!(
        out.status.success(),
        "chromium failed: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8_lossy(&out.stdout).into_owned()
}

/// The `<tr>` of `peer` in the peers table.
fn peer_row<'d>(dom: &'d str, peer: &str) -> &'d str {
    let start = dom
        .find(&format!("data-peer=\"{peer}\""))
        .unwrap_or_else(|| panic!("no row for {peer} in the page:\n{dom}"));
    let row = &dom[start..];
    &row[..row.find("</tr>").unwrap_or(row.len())]
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_page_shows_a_fake_online_agent_out_of_rotation_with_its_reason() {
    let Some(chromium) = chromium() else {
        support::skip::skip(
            "tests/it/status_page.rs",
            "chromium not installed (apt-get install -y chromium, or set CHROMIUM): the status page was not checked in a browser",
            support::skip::InCi::Fails,
        );
        return;
    };
    let fleet = Fleet::start(demo_policy()).await.unwrap();
    let c = client();
    let outbound = fleet.caller.addrs.outbound;
    eventually(
        Duration::from_secs(20),
        "the caller has served calls on every agent",
        || async {
            call(&c, outbound).await;
            let views = fleet.caller.status().peer_views;
            views.len() == fleet.agents.len() && views.iter().all(|p| p.outcomes.success > 0)
        },
    )
    .await;

    fleet.agents[1].0.set_mode(Mode::RateLimited);
    eventually(
        Duration::from_secs(20),
        "the caller sees coder-2 ejected or on probation",
        || async {
            call(&c, outbound).await;
            fleet.caller.status().peer_views.iter().any(|p| {
                p.name == BROKEN && matches!(p.effective_state, State::Ejected | State::Probation)
            })
        },
    )
    .await;
    // More traffic until the sparklines have a sampled point besides the live one (the history
    // samples every 10 s), so the healthy peers' figures and the outcome counts fill in.
    let admin = fleet.caller.addrs.admin;
    eventually(
        Duration::from_secs(25),
        "the sparklines have a sampled point",
        || async {
            for _ in 0..5 {
                call(&c, outbound).await;
            }
            let page = get(&c, &format!("http://{admin}/?format=html")).await.body;
            page.contains("data-peer=\"coder-1\"")
                // Two points at least: a line, not a dot.
                && peer_row(&page, "coder-1")
                    .split("<polyline points=\"")
                    .nth(1)
                    .and_then(|points| points.split('"').next())
                    .is_some_and(|points| points.contains(' '))
        },
    )
    .await;

    // A script still gets the plain index at `/`; a browser gets the page.
    let index = get(&c, &format!("http://{admin}/")).await;
    assert!(index.body.contains("/metrics"), "{}", index.body);
    assert!(index.header("content-type").starts_with("text/plain"));

    let url = format!("http://{admin}/");
    let dom = {
        let (chromium, url) = (chromium.clone(), url.clone());
        tokio::task::spawn_blocking(move || headless(&chromium, &url, &["--dump-dom"]))
            .await
            .unwrap()
    };
    assert!(
        dom.contains("<h2>Problems"),
        "the page leads with problems:\n{dom}"
    );
    let row = peer_row(&dom, BROKEN);
    assert!(
        row.contains("data-state=\"ejected\"") || row.contains("data-state=\"probation\""),
        "coder-2 is shown out of rotation: {row}"
    );
    // Gossip carries a peer's state, not its reasons: the caller shows whose view took the
    // agent out (its own, or this caller's with the transition's reason) and what its calls saw.
    assert!(
        [
            "its own view: ejected",
            "its own view: probation",
            "this caller: "
        ]
        .iter()
        .any(|why| row.contains(why)),
        "coder-2's reason is shown: {row}"
    );
    // Problems first: the broken agent's row comes before every healthy one.
    let broken_at = dom.find(&format!("data-peer=\"{BROKEN}\"")).unwrap();
    for healthy in ["coder-1", "coder-3"] {
        let at = dom.find(&format!("data-peer=\"{healthy}\"")).unwrap();
        assert!(broken_at < at, "{BROKEN} is listed before {healthy}");
        assert!(peer_row(&dom, healthy).contains("data-state=\"healthy\""));
    }
    assert!(dom.contains("id=\"transitions\""), "{dom}");
    assert!(
        dom.contains("<svg class=\"spark\""),
        "sparklines are drawn:\n{dom}"
    );
    assert!(dom.contains("id=\"gossip\""), "{dom}");
    assert!(
        !dom.contains("<script src") && !dom.contains("<link"),
        "no external resources"
    );

    // The broken agent's own page has the probe's reason.
    let own = format!("http://{}/", fleet.agents[1].1.addrs.admin);
    let own_dom = {
        let chromium = chromium.clone();
        tokio::task::spawn_blocking(move || headless(&chromium, &own, &["--dump-dom"]))
            .await
            .unwrap()
    };
    let problems = &own_dom[own_dom.find("id=\"problems\"").expect("a problems section")..];
    let problems = &problems[..problems.find("</section>").unwrap_or(problems.len())];
    assert!(
        problems.contains("This agent is <span class=\"pill ejected\">ejected</span>")
            && problems.contains("last probe failed: status 429"),
        "coder-2's own page says it is ejected because its probe got 429: {problems}"
    );

    // `agent-reach status` shows the same picture: the broken agent first.
    let out = tokio::task::spawn_blocking(move || {
        Command::new(env!("CARGO_BIN_EXE_agent-reach"))
            .args(["status", "--admin", &format!("http://{admin}")])
            .output()
            .unwrap()
    })
    .await
    .unwrap();
    let table = String::from_utf8_lossy(&out.stdout);
    eprintln!("agent-reach status:\n{table}");
    let first = table
        .lines()
        .skip_while(|l| !l.starts_with("PEER"))
        .nth(1)
        .unwrap_or_default();
    assert!(
        first.starts_with(BROKEN) && (first.contains("ejected") || first.contains("probation")),
        "{table}"
    );

    let shot = target_dir().join("status-page.png");
    let _ = std::fs::remove_file(&shot);
    let arg = format!("--screenshot={}", shot.display());
    tokio::task::spawn_blocking(move || {
        headless(&chromium, &url, &[&arg, "--window-size=1280,1600"])
    })
    .await
    .unwrap();
    let png = std::fs::read(&shot).unwrap();
    assert!(png.starts_with(b"\x89PNG"), "a PNG at {}", shot.display());
    eprintln!("screenshot: {}", shot.display());
    fleet.shutdown().await;
}
