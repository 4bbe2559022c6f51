//! The journey page (`/debug/journey`, `src/ops/journey.rs`) in a real headless browser:
//! Debian's chromium driven over WebDriver (chromedriver, through fantoccini), against the
//! real control plane and the real `kubeloop sample-controller --trace`. The page is read
//! through its DOM's `data-` attributes, as a person reads its lanes, marks and links.
//!
//! Chromium and chromedriver must be installed (`hack/test` installs Debian's `chromium` and
//! `chromium-driver`); without them these tests fail and say so.

use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use fantoccini::{Client, ClientBuilder};
use k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition;
use kubeloop::testing::eventually;
use kubeloop_testenv::{self as testenv, Cluster, Kubeloop, ManagedProcess};
use serde_json::{Value, json};

/// What the page must show within: the steps arrive with the next poll (a second), the rest
/// is the control plane's and the browser's own pace on a loaded machine.
const PAGE_WAIT: Duration = Duration::from_secs(20);
const WAIT: Duration = Duration::from_secs(120);

/// A headless chromium under its chromedriver. [`Browser::close`] ends both; a drop (a test
/// that panicked) kills chromedriver only, and the chromium it started outlives it.
struct Browser {
    client: Client,
    _driver: ManagedProcess,
}

/// The programs the test drives, where Debian's packages put them.
fn installed(name: &str) -> PathBuf {
    let path = Path::new("/usr/bin").join(name);
    assert!(
        path.exists(),
        "{} is missing: the journey page test needs Debian's chromium and chromium-driver; \
         run hack/test (it installs them: apt-get install chromium chromium-driver)",
        path.display()
    );
    path
}

impl Browser {
    async fn open() -> Self {
        let chromium = installed("chromium");
        let chromedriver = installed("chromedriver");
        let port = testenv::free_port().expect("a free port");
        let mut command = std::process::Command::new(chromedriver);
        command.arg(format!("--port={port}"));
        let mut driver =
            ManagedProcess::start_temp_log("chromedriver", command).expect("chromedriver starts");
        driver
            .wait_for_line(&["started successfully"], Duration::from_secs(30))
            .await;
        let mut caps = serde_json::Map::new();
        caps.insert(
            "goog:chromeOptions".into(),
            json!({
                "binary": chromium,
                "args": ["--headless=new", "--no-sandbox", "--disable-gpu",
                         "--disable-dev-shm-usage", "--window-size=1280,900"],
            }),
        );
        let connector = hyper_util::client::legacy::connect::HttpConnector::new();
        let client = ClientBuilder::new(connector)
            .capabilities(caps)
            .connect(&format!("http://127.0.0.1:{port}"))
            .await
            .unwrap_or_else(|e| {
                panic!(
                    "no browser session from chromedriver: {e}\n{}",
                    driver.log_tail(20)
                )
            });
        Self {
            client,
            _driver: driver,
        }
    }

    /// Ends the WebDriver session, which makes chromedriver quit chromium, then chromedriver.
    async fn close(self) {
        self.client.close().await.expect("the browser session ends");
    }

    async fn goto(&self, url: &str) {
        self.client.goto(url).await.expect("the page loads");
    }

    /// Runs `script` (a function body) in the page and returns what it returns.
    async fn eval(&self, script: &str) -> Value {
        self.client
            .execute(script, vec![])
            .await
            .unwrap_or_else(|e| panic!("script failed: {e}\n{script}"))
    }

    /// Waits until `script` returns something other than `null` or `false`, and returns it.
    async fn until(&self, what: &str, script: &str) -> Value {
        eventually(what, PAGE_WAIT, || async {
            let v = self.eval(script).await;
            match v {
                Value::Null | Value::Bool(false) => Err(format!(
                    "not yet; the page says: {}",
                    self.eval(PAGE_TEXT).await
                )),
                v => Ok(v),
            }
        })
        .await
    }

    async fn problem(&self) -> String {
        self.until(
            "the page to show a problem",
            "const p = document.getElementById('problem'); return p.dataset.problem || null;",
        )
        .await
        .as_str()
        .unwrap()
        .to_owned()
    }
}

/// The page's visible text, for failure messages.
const PAGE_TEXT: &str = "return document.body.innerText.slice(0, 2000);";

/// The key's lanes, its reconciles, and the Deployment's watch events linked to one of them.
const LANES_AND_LINKS: &str = r#"
const sec = document.querySelector('section.key');
if (!sec) return null;
const lanes = [...sec.querySelectorAll('.label[data-lane]')].map(l => [l.dataset.lane, l.querySelector('code').textContent]);
const reconciles = [...sec.querySelectorAll('.span[data-reconcile]')].map(r => r.dataset.reconcile);
const linked = [...sec.querySelectorAll('.mark[data-lane=watch][data-kind=Deployment][data-caused-by]')]
  .map(m => ({ by: m.dataset.causedBy, cause: m.dataset.cause,
               curve: !!sec.querySelector(`path[data-from-reconcile="${m.dataset.causedBy}"][data-to-step="${m.dataset.step}"]`),
               reconcile: !!sec.querySelector(`.span[data-reconcile="${m.dataset.causedBy}"]`) }));
const own = [...sec.querySelectorAll('.mark[data-lane=watch][data-kind=Foo][data-cause="its own status write"]')]
  .filter(m => sec.querySelector(`path[data-from-reconcile="${m.dataset.causedBy}"][data-to-step="${m.dataset.step}"]`)).length;
if (reconciles.length === 0 || linked.length === 0 || own === 0) return null;
return { key: sec.dataset.key, steps: Number(sec.dataset.steps), lanes, reconciles, linked, own,
         started: sec.querySelectorAll('.mark[data-stage=reconcile_started]').length,
         polls: Number(document.getElementById('status').dataset.polls),
         live: document.getElementById('status').dataset.live };
"#;

async fn foo_crd(cluster: &Cluster) {
    let client = cluster.client().await.unwrap();
    let crd: CustomResourceDefinition =
        serde_saphyr::from_str(include_str!("../crds/foo.yaml")).expect("crds/foo.yaml parses");
    testenv::ensure_crd(&client, &crd).await;
}

/// `kubeloop sample-controller` watching `ns`, metrics in plain HTTP on a free loopback port,
/// following `trace` if given; and that address once its page answers.
async fn sample_controller(
    cluster: &Cluster,
    ns: &str,
    trace: Option<&str>,
) -> (ManagedProcess, String) {
    let ops = format!("127.0.0.1:{}", testenv::free_port().expect("a free port"));
    let mut args = vec![
        "sample-controller",
        "--namespace",
        ns,
        "--metrics-bind-address",
        &ops,
        "--metrics-secure=false",
    ];
    if let Some(key) = trace {
        args.extend(["--trace", key]);
    }
    let mut controller = Kubeloop::new(args)
        .kubeconfig(cluster.kubeconfig_path())
        .name(&format!("sample-controller-{ns}"))
        .log_in(cluster)
        .start();
    controller.wait_for_line(&["caches synced"], WAIT).await;
    (controller, ops)
}

/// `kubeloop trace --serve --listen 127.0.0.1:0 <args>` (its log named after `name`), and the
/// page's address it prints.
async fn trace_serve(cluster: &Cluster, name: &str, args: &[&str]) -> (ManagedProcess, String) {
    let mut all = vec!["trace", "--serve", "--listen", "127.0.0.1:0"];
    all.extend_from_slice(args);
    let mut serving = Kubeloop::new(all)
        .name(&format!("trace-serve-{name}"))
        .log_in(cluster)
        .start();
    let line = serving
        .wait_for_line(&["journey page: http://"], Duration::from_secs(60))
        .await;
    let url = line
        .split_whitespace()
        .find(|w| w.starts_with("http://"))
        .unwrap()
        .to_owned();
    (serving, url)
}

/// One plain HTTP GET's body, its length in bytes.
async fn get(url: &str) -> String {
    let (host, path) = url
        .strip_prefix("http://")
        .unwrap()
        .split_once('/')
        .unwrap();
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let mut stream = tokio::net::TcpStream::connect(host).await.unwrap();
    let request = format!("GET /{path} HTTP/1.1\r\nHost: {host}\r\nConnection: close\r\n\r\n");
    stream.write_all(request.as_bytes()).await.unwrap();
    let mut raw = String::new();
    stream.read_to_string(&mut raw).await.unwrap();
    let (head, body) = raw.split_once("\r\n\r\n").unwrap();
    assert!(head.starts_with("HTTP/1.1 200"), "{url}: {head}\n{body}");
    body.to_owned()
}

/// Decodes a PNG and checks it is an image of something: not empty, not one flat colour.
fn check_screenshot(png_bytes: &[u8]) -> (u32, u32, usize) {
    let decoder = png::Decoder::new(png_bytes);
    let mut reader = decoder.read_info().expect("the screenshot is a PNG");
    let mut pixels = vec![0; reader.output_buffer_size()];
    let info = reader.next_frame(&mut pixels).expect("its pixels decode");
    let bytes_per_pixel = info.line_size / info.width as usize;
    let colours: std::collections::HashSet<&[u8]> = pixels[..info.buffer_size()]
        .chunks(bytes_per_pixel)
        .collect();
    assert!(info.width >= 600 && info.height >= 400, "{info:?}");
    assert!(
        colours.len() >= 8,
        "the screenshot has {} colours: a blank page",
        colours.len()
    );
    (info.width, info.height, colours.len())
}

#[tokio::test]
async fn the_page_shows_a_foo_s_lanes_its_reconcile_and_the_deployment_it_caused_live() {
    let cluster = testenv::shared().await;
    foo_crd(cluster).await;
    let ns = cluster.new_namespace("journey").await.unwrap();
    let key = format!("{ns}/journey-foo");
    let (_controller, ops) = sample_controller(cluster, &ns, Some(&key)).await;
    let browser = Browser::open().await;
    let page = format!("http://{ops}/debug/journey?key={}", key.replace('/', "%2F"));
    browser.goto(&page).await;
    browser
        .until(
            "the page to be live with the key followed and no step yet",
            "return document.getElementById('status').dataset.live === 'true' \
             && !!document.querySelector('section.key[data-steps=\"0\"]');",
        )
        .await;

    let foo = format!(
        "apiVersion: samplecontroller.k8s.io/v1alpha1\nkind: Foo\nmetadata:\n  name: journey-foo\n  \
         namespace: {ns}\nspec:\n  deploymentName: journey-foo\n  replicas: 1\n"
    );
    cluster
        .kubectl_stdin(&["apply", "-f", "-"], Some(&foo))
        .ok();
    let shown = browser
        .until(
            "the Foo's lanes, its reconcile, the Deployment it caused and its own status write",
            LANES_AND_LINKS,
        )
        .await;
    println!("the page after the create: {shown}");
    assert_eq!(shown["key"], key.as_str());
    let lanes: Vec<&str> = shown["lanes"]
        .as_array()
        .unwrap()
        .iter()
        .map(|l| l[0].as_str().unwrap())
        .collect();
    assert_eq!(
        lanes,
        [
            "watch",
            "fifo",
            "indexer",
            "handlers",
            "workqueue",
            "worker",
            "reconcile",
            "writes"
        ]
    );
    for lane in shown["lanes"].as_array().unwrap() {
        let function = lane[1].as_str().unwrap();
        assert!(
            function.starts_with("client-go") || function.starts_with("controller-runtime"),
            "each lane names the function it mirrors: {lane}"
        );
    }
    assert!(shown["started"].as_u64().unwrap() >= 1, "{shown}");
    let linked = &shown["linked"][0];
    assert_eq!(linked["cause"], "the child it created", "{shown}");
    assert_eq!(
        linked["reconcile"], true,
        "linked to a reconcile on the page: {shown}"
    );
    assert_eq!(
        linked["curve"], true,
        "a curve from the reconcile to it: {shown}"
    );

    // Live: the same page, not reloaded, gets the update's steps.
    browser
        .eval("window.journeyTestMarker = 'still here'; return true;")
        .await;
    let before = browser
        .eval(&format!("{STEPS_AND_POLLS_FN} return f();"))
        .await;
    cluster
        .kubectl(&[
            "patch",
            "foo",
            "journey-foo",
            "-n",
            &ns,
            "--type=merge",
            "-p",
            r#"{"spec":{"replicas":2}}"#,
        ])
        .ok();
    let after = browser
        .until(
            "new steps to arrive on the open page",
            &format!(
                "{STEPS_AND_POLLS_FN} const now = f(); return now.steps > {} && now.modified > {} ? now : null;",
                before["steps"], before["modified"]
            ),
        )
        .await;
    println!("before the update: {before}; after: {after}");
    assert_eq!(after["marker"], "still here", "the page was not reloaded");
    assert!(
        after["polls"].as_u64() > before["polls"].as_u64(),
        "{after}"
    );

    let shot = browser.client.screenshot().await.expect("a screenshot");
    let (w, h, colours) = check_screenshot(&shot);
    let path = cluster.dir().join("journey-page.png");
    std::fs::write(&path, &shot).unwrap();
    if let Ok(copy) = std::env::var("KUBELOOP_JOURNEY_SCREENSHOT") {
        std::fs::write(&copy, &shot).unwrap();
    }
    println!(
        "screenshot {} ({w}x{h}, {colours} colours, {} bytes)",
        path.display(),
        shot.len()
    );

    // The same page through `kubeloop trace --serve`, read through from the controller.
    let (_serving, url) = trace_serve(
        cluster,
        &format!("{ns}-read-through"),
        &["--ops-address", &ops, &key],
    )
    .await;
    browser.goto(&url).await;
    let through = browser
        .until("the read-through page's lanes and links", LANES_AND_LINKS)
        .await;
    assert_eq!(through["key"], key.as_str());
    let source = browser
        .eval("return document.getElementById('source').dataset.source;")
        .await;
    assert!(source.as_str().unwrap().contains(&ops), "{source}");

    // The page's cost with a full ring: 512 steps, saved and served by `trace --serve --file`.
    let saved: Vec<Value> = serde_json::from_str(
        &get(&format!(
            "http://{ops}/debug/trace?key={}&format=json",
            key.replace('/', "%2F")
        ))
        .await,
    )
    .unwrap();
    let span = saved.last().unwrap()["mono_micros"].as_u64().unwrap() + 1000;
    let full: Vec<Value> = (0..512)
        .map(|i| {
            let mut step = saved[i % saved.len()].clone();
            let shift = (i / saved.len()) as u64 * span;
            for field in ["mono_micros", "at_unix_micros"] {
                step[field] = json!(step[field].as_u64().unwrap() + shift);
            }
            step
        })
        .collect();
    let file = cluster.dir().join(format!("{ns}-512-steps.json"));
    std::fs::write(&file, serde_json::to_string_pretty(&full).unwrap()).unwrap();
    let (_saved_page, url) = trace_serve(
        cluster,
        &format!("{ns}-512"),
        &["--file", file.to_str().unwrap()],
    )
    .await;
    let opened = Instant::now();
    browser.goto(&url).await;
    let rendered = browser
        .until(
            "512 steps drawn",
            "const s = document.querySelector('section.key[data-steps=\"512\"]'); \
             return s ? { marks: s.querySelectorAll('.mark').length, ms: document.body.dataset.renderMs } : null;",
        )
        .await;
    let loaded = opened.elapsed();
    assert_eq!(rendered["marks"], 512, "{rendered}");
    let page_bytes = get(&url).await.len();
    let data_bytes = get(&format!("{url}?format=json&since=0")).await.len();
    println!(
        "journey page with 512 steps: page {page_bytes} bytes, data {data_bytes} bytes, \
         drawn in {} ms (the page's own measure), loaded and drawn within {} ms",
        rendered["ms"].as_str().unwrap_or("?"),
        loaded.as_millis()
    );
    browser.close().await;
}

/// A function `f`: the key's steps, the Foo's watch events, the polls so far, and the marker a
/// test leaves on the page (gone if it was reloaded).
const STEPS_AND_POLLS_FN: &str = r#"
const f = () => {
const sec = document.querySelector('section.key');
return { steps: sec ? Number(sec.dataset.steps) : 0,
         polls: Number(document.getElementById('status').dataset.polls),
         marker: window.journeyTestMarker || null,
         modified: sec ? sec.querySelectorAll('.mark[data-stage=watch_event][data-kind=Foo]').length : 0 };
};
"#;

#[tokio::test]
async fn bad_input_gets_words_on_the_page_and_an_open_page_does_not_hold_up_shutdown() {
    let cluster = testenv::shared().await;
    foo_crd(cluster).await;
    let browser = Browser::open().await;

    // A key the controller does not follow.
    let ns = cluster.new_namespace("journey-bad").await.unwrap();
    let (mut traced, ops) = sample_controller(cluster, &ns, Some(&format!("{ns}/followed"))).await;
    browser
        .goto(&format!("http://{ops}/debug/journey?key={ns}%2Fnope"))
        .await;
    let words = browser.problem().await;
    assert!(
        words.contains(&format!("\"{ns}/nope\" is not traced here"))
            && words.contains(&format!("{ns}/followed")),
        "{words}"
    );

    // A controller started without --trace.
    let plain_ns = cluster.new_namespace("journey-untraced").await.unwrap();
    let (_plain, plain_ops) = sample_controller(cluster, &plain_ns, None).await;
    browser
        .goto(&format!("http://{plain_ops}/debug/journey"))
        .await;
    let words = browser.problem().await;
    assert!(
        words.contains("no key is traced: start the controller with --trace"),
        "{words}"
    );

    // A saved trace that does not parse.
    let bad = cluster.dir().join(format!("{ns}-not-a-trace.json"));
    std::fs::write(&bad, "{\"this is\": \"not a list of steps\"}").unwrap();
    let (_serving, url) = trace_serve(
        cluster,
        &format!("{ns}-bad-file"),
        &["--file", bad.to_str().unwrap()],
    )
    .await;
    browser.goto(&url).await;
    let words = browser.problem().await;
    assert!(
        words.contains("does not parse as `kubeloop trace --json` output"),
        "{words}"
    );

    // Two controllers on one page (`--ops-address` twice): the traced one's key, named with
    // its address, and the untraced one named in the header with its words.
    let (_both, url) = trace_serve(
        cluster,
        &format!("{ns}-two"),
        &["--ops-address", &ops, "--ops-address", &plain_ops],
    )
    .await;
    browser.goto(&url).await;
    let header = browser
        .until(
            "both controllers on one page",
            &format!(
                "const s = document.getElementById('source').dataset.source || ''; \
                 return document.querySelector('section[data-key=\"{ns}/followed @ {ops}\"]') \
                 && s.includes('{plain_ops}: ') ? s : null;"
            ),
        )
        .await;
    let header = header.as_str().unwrap();
    assert!(
        header.starts_with(&format!(
            "2 controllers: {ops}, {plain_ops} (not read now: "
        )) && header.contains("no key is traced"),
        "{header}"
    );

    // A page left open and polling does not keep the controller from stopping.
    browser.goto(&format!("http://{ops}/debug/journey")).await;
    let polls = browser
        .until(
            "the open page to poll",
            "const s = document.getElementById('status'); \
             return s.dataset.live === 'true' && Number(s.dataset.polls) >= 2 ? Number(s.dataset.polls) : null;",
        )
        .await;
    println!("the page polled {polls} times; stopping the controller");
    traced.signal(libc::SIGTERM);
    let status = traced.wait(Duration::from_secs(30)).await;
    assert!(
        status.success(),
        "the controller exits cleanly with the page open, got {status}:\n{}",
        traced.log_tail(30)
    );
    let words = browser.problem().await;
    assert!(words.contains("cannot reach the server"), "{words}");
    browser.close().await;
}
