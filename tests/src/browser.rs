//! A real browser for the tests: Debian's headless Chromium driven over WebDriver by a
//! chromedriver of its own per test (its own port and a fresh profile), so browser tests run
//! in parallel with each other and with the rest of the suite. Dropping the `Browser` kills
//! chromedriver's whole process group, Chromium with it, and removes the profile.
//!
//! Screenshots are test artifacts, written to `<target>/browser-artifacts/<test>-<label>.png`,
//! `<target>` being `CARGO_TARGET_DIR` when it is set and the workspace's `target/` when not.
//! A wait that times out saves `<test>-failure.png` there before it fails, and chromedriver's
//! log goes to `<test>-chromedriver.log`.

use fantoccini::elements::Element;
use fantoccini::wd::Capabilities;
use fantoccini::{Client, ClientBuilder, Locator};
use hyper_util::client::legacy::connect::HttpConnector;
use serde_json::{Value, json};
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::{Child, Command};
use std::time::Duration;

/// How long the browser may take for anything. Generous: Chromium shares two cores with the
/// rest of the suite.
pub const BROWSER_PATIENCE: Duration = Duration::from_secs(30);

/// The flags of every run, besides the profile directory and the window size.
const FLAGS: [&str; 7] = [
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
    "--no-first-run",
];

/// A phone's browser as sites see it; with the emulated device metrics it makes Chromium
/// honour a page's viewport, as phones do (a desktop window ignores it).
const PHONE_USER_AGENT: &str = "Mozilla/5.0 (Linux; Android 14; Pixel 8) AppleWebKit/537.36 \
     (KHTML, like Gecko) Chrome/156.0.0.0 Mobile Safari/537.36";

/// The screen a test looks through.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Screen {
    /// A laptop's window, 1280 × 900.
    Desktop,
    /// A phone, 390 × 844 CSS pixels at two device pixels each, touch, mobile user agent.
    Phone,
}

impl Screen {
    fn size(self) -> (u32, u32) {
        match self {
            Screen::Desktop => (1280, 900),
            Screen::Phone => (390, 844),
        }
    }

    fn capabilities(self, profile: &Path) -> Capabilities {
        let (width, height) = self.size();
        let mut args: Vec<String> = FLAGS.iter().map(std::string::ToString::to_string).collect();
        args.push(format!("--user-data-dir={}", profile.display()));
        args.push(format!("--window-size={width},{height}"));
        let mut options = json!({ "args": args });
        if self == Screen::Phone {
            options["mobileEmulation"] = json!({
                "deviceMetrics": {
                    "width": width, "height": height, "pixelRatio": 2,
                    "mobile": true, "touch": true,
                },
                "userAgent": PHONE_USER_AGENT,
            });
        }
        let capabilities = json!({ "browserName": "chrome", "goog:chromeOptions": options });
        let Value::Object(capabilities) = capabilities else {
            unreachable!("an object literal")
        };
        capabilities
    }
}

/// Where screenshots and logs of browser tests go.
pub fn artifacts_dir() -> PathBuf {
    let workspace = Path::new(env!("CARGO_MANIFEST_DIR")).join("..");
    let target = std::env::var_os("CARGO_TARGET_DIR")
        .map(|dir| workspace.join(dir))
        .unwrap_or_else(|| workspace.join("target"));
    target.join("browser-artifacts")
}

/// A running chromedriver, in a process group of its own so that the Chromium it starts is
/// stopped with it, and the profile directory that Chromium uses.
struct Driver {
    child: Child,
    url: String,
    profile: PathBuf,
}

impl Driver {
    /// Starts chromedriver on a free port and waits until it is ready for sessions.
    async fn start(name: &str) -> Self {
        let artifacts = artifacts_dir();
        std::fs::create_dir_all(&artifacts).unwrap();
        // The port is free when asked for; should another process take it before chromedriver
        // binds it, chromedriver exits and is started again on another.
        for _ in 0..3 {
            let profile = std::env::temp_dir().join(format!(
                "countersign-chromium-{}",
                uuid::Uuid::new_v4().simple()
            ));
            std::fs::create_dir_all(&profile).unwrap();
            let port = std::net::TcpListener::bind("127.0.0.1:0")
                .unwrap()
                .local_addr()
                .unwrap()
                .port();
            let log =
                std::fs::File::create(artifacts.join(format!("{name}-chromedriver.log"))).unwrap();
            let child = Command::new("chromedriver")
                .arg(format!("--port={port}"))
                .stdout(log.try_clone().unwrap())
                .stderr(log)
                .process_group(0)
                .spawn()
                .unwrap_or_else(|e| {
                    panic!("cannot start chromedriver (apt-get install chromium-driver): {e}")
                });
            let mut driver = Self {
                child,
                url: format!("http://127.0.0.1:{port}"),
                profile,
            };
            if driver.ready().await {
                return driver;
            }
        }
        panic!(
            "chromedriver did not start; see its log in {}",
            artifacts.display()
        );
    }

    /// Whether chromedriver answers that it is ready, asked until it does, exits or times out.
    async fn ready(&mut self) -> bool {
        let http = reqwest::Client::new();
        let deadline = tokio::time::Instant::now() + BROWSER_PATIENCE;
        while tokio::time::Instant::now() < deadline {
            if self.child.try_wait().unwrap().is_some() {
                return false;
            }
            let status = http.get(format!("{}/status", self.url)).send().await;
            if let Ok(response) = status {
                let body: Value = response.json().await.unwrap_or_default();
                if body["value"]["ready"] == true {
                    return true;
                }
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
        false
    }
}

impl Drop for Driver {
    fn drop(&mut self) {
        let group = rustix::process::Pid::from_child(&self.child);
        let _ = rustix::process::kill_process_group(group, rustix::process::Signal::KILL);
        let _ = self.child.wait();
        let _ = std::fs::remove_dir_all(&self.profile);
    }
}

/// Headless Chromium at one screen size, for one test.
pub struct Browser {
    pub client: Client,
    /// The test's name, which its artifacts start with.
    name: String,
    screen: Screen,
    driver: Driver,
}

impl Browser {
    /// Starts chromedriver and a Chromium session on `screen`; `name` (the test's) names its
    /// artifacts.
    pub async fn start(name: &str, screen: Screen) -> Self {
        let driver = Driver::start(name).await;
        let client = ClientBuilder::new(HttpConnector::new())
            .capabilities(screen.capabilities(&driver.profile))
            .connect(&driver.url)
            .await
            .unwrap_or_else(|e| panic!("cannot open a Chromium session: {e}"));
        Self {
            client,
            name: name.to_string(),
            screen,
            driver,
        }
    }

    pub async fn goto(&self, url: &str) {
        self.client
            .goto(url)
            .await
            .unwrap_or_else(|e| panic!("cannot open {url}: {e}"));
    }

    /// Runs `script` (a function body: `return …`) in the page and returns its result.
    pub async fn eval(&self, script: &str) -> Value {
        self.client
            .execute(script, Vec::new())
            .await
            .unwrap_or_else(|e| panic!("script failed: {e}\n{script}"))
    }

    /// Waits until `script` returns something other than `null`, `false` or nothing, and
    /// returns that. A page still loading counts as not yet.
    pub async fn wait_until(&self, what: &str, script: &str) -> Value {
        let deadline = tokio::time::Instant::now() + BROWSER_PATIENCE;
        let mut last = Value::Null;
        loop {
            match self.client.execute(script, Vec::new()).await {
                Ok(Value::Null | Value::Bool(false)) => {}
                Ok(value) => return value,
                Err(e) => last = Value::String(e.to_string()),
            }
            if tokio::time::Instant::now() >= deadline {
                let why = format!("timed out waiting for {what} (last script error: {last})");
                self.fail(&why).await;
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    }

    /// The first element matching `css`, once there is one.
    pub async fn find(&self, css: &str) -> Element {
        let deadline = tokio::time::Instant::now() + BROWSER_PATIENCE;
        loop {
            if let Ok(element) = self.client.find(Locator::Css(css)).await {
                return element;
            }
            if tokio::time::Instant::now() >= deadline {
                self.fail(&format!("timed out waiting for an element `{css}`"))
                    .await;
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    }

    /// The text of the first element matching `css`, once one contains `needle` (any case).
    pub async fn wait_for_text(&self, css: &str, needle: &str) -> String {
        let script = format!(
            "const e = document.querySelector({css}); const t = e && e.innerText; \
             return t && t.toLowerCase().includes({needle}) ? t : null;",
            css = json!(css),
            needle = json!(needle.to_lowercase()),
        );
        let what = format!("`{css}` to say {needle:?}");
        let text = self.wait_until(&what, &script).await;
        text.as_str().unwrap_or_default().to_string()
    }

    /// Types `text` into the field matching `css`, in place of what it held.
    pub async fn fill(&self, css: &str, text: &str) {
        let field = self.find(css).await;
        field.clear().await.unwrap();
        field.send_keys(text).await.unwrap();
    }

    /// Clicks the element matching `css`, scrolled to the middle of the window first, as a
    /// person scrolls to what they tap: at the window's edge it may be under a fixed bar.
    pub async fn click(&self, css: &str) {
        let element = self.find(css).await;
        let script = format!(
            "document.querySelector({}).scrollIntoView({{block: 'center'}}); return true",
            json!(css)
        );
        self.eval(&script).await;
        if let Err(e) = element.click().await {
            self.fail(&format!("cannot click `{css}`: {e}")).await;
        }
    }

    /// Types `keys` as a person at the keyboard does: into whatever has the focus.
    pub async fn press(&self, keys: &str) {
        let focused = self.client.active_element().await.unwrap();
        if let Err(e) = focused.send_keys(keys).await {
            self.fail(&format!("cannot press {keys:?}: {e}")).await;
        }
    }

    /// Waits for the page's `confirm` dialog, answers it (`yes` accepts) and returns what it
    /// asked.
    pub async fn answer_confirm(&self, yes: bool) -> String {
        let deadline = tokio::time::Instant::now() + BROWSER_PATIENCE;
        loop {
            if let Ok(text) = self.client.get_alert_text().await {
                let answered = if yes {
                    self.client.accept_alert().await
                } else {
                    self.client.dismiss_alert().await
                };
                answered.unwrap();
                return text;
            }
            if tokio::time::Instant::now() >= deadline {
                self.fail("timed out waiting for a confirmation dialog")
                    .await;
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    }

    /// The page's visible text.
    pub async fn text(&self) -> String {
        let text = self.eval("return document.body.innerText").await;
        text.as_str().unwrap_or_default().to_string()
    }

    /// Asserts that nothing on the page is wider than the window, so there is no sideways
    /// scrolling, and on a phone that the page is laid out at the screen's width, as a page
    /// with a viewport for phones is (one without is laid out 980 px wide and shown zoomed out).
    pub async fn assert_fits_the_screen(&self) {
        let widths = self
            .eval(
                "const d = document.documentElement; \
                 return [d.clientWidth, screen.width, d.scrollWidth];",
            )
            .await;
        let [layout, screen, content] = [0, 1, 2].map(|i| widths[i].as_u64().unwrap());
        if self.screen == Screen::Phone {
            assert_eq!(
                layout, screen,
                "the page is laid out {layout} px wide on a screen {screen} px wide"
            );
        }
        assert!(
            content <= layout,
            "the page is {content} px wide, wider than its {layout} px: it scrolls sideways"
        );
    }

    /// Saves the whole page, below the fold too, as `<test>-<label>.png` among the artifacts;
    /// its path.
    pub async fn screenshot(&self, label: &str) -> PathBuf {
        let png = self.whole_page().await.unwrap();
        let path = artifacts_dir().join(format!("{}-{label}.png", self.name));
        std::fs::write(&path, png).unwrap();
        path
    }

    /// The whole page as PNG. WebDriver captures only the window, so this asks Chromium
    /// itself (a DevTools command, through chromedriver), for the window's width (scroll bar
    /// included: the page is laid out without one while it is captured whole).
    async fn whole_page(&self) -> anyhow::Result<Vec<u8>> {
        use base64::Engine;
        let session = self.client.session_id().await?;
        let session = session.ok_or_else(|| anyhow::anyhow!("no WebDriver session"))?;
        let url = format!("{}/session/{session}/goog/cdp/execute", self.driver.url);
        let size = self
            .client
            .execute(
                "return [innerWidth, document.documentElement.scrollHeight]",
                Vec::new(),
            )
            .await?;
        let command = json!({
            "cmd": "Page.captureScreenshot",
            "params": {
                "format": "png",
                "captureBeyondViewport": true,
                "clip": {"x": 0, "y": 0, "width": size[0], "height": size[1], "scale": 1},
            },
        });
        let answer: Value = reqwest::Client::new()
            .post(url)
            .json(&command)
            .send()
            .await?
            .error_for_status()?
            .json()
            .await?;
        let data = answer["value"]["data"].as_str().unwrap_or_default();
        Ok(base64::engine::general_purpose::STANDARD.decode(data)?)
    }

    /// Fails the test with `why`, the page's address and text, and a screenshot of it.
    async fn fail(&self, why: &str) -> ! {
        let url = self.client.current_url().await.map(|u| u.to_string());
        let text = self
            .client
            .execute("return document.body.innerText", Vec::new());
        let text = text.await.unwrap_or_default();
        let shot = match self.whole_page().await {
            Ok(png) => {
                let path = artifacts_dir().join(format!("{}-failure.png", self.name));
                std::fs::write(&path, png).map(|_| path.display().to_string())
            }
            Err(e) => Ok(format!("no screenshot: {e}")),
        };
        panic!(
            "{why}\npage: {url:?}\nscreenshot: {shot:?}\ntext:\n{}",
            text.as_str().unwrap_or_default()
        );
    }
}
