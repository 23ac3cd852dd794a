package console_test

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"image/png"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/chromedp/cdproto/runtime"
	"github.com/chromedp/chromedp"

	"github.com/stormdock/stormdock/daemon"
	"github.com/stormdock/stormdock/internal/clustertest"
	"github.com/stormdock/stormdock/internal/testenv"
)

// stormdockBin is the stormdock binary the local clusters' nodes run workers with
// (daemon.LocalConfig.Self): the lease launcher, `stormdock worker wordcount` and output
// routers. allocBinary allocates memory in steps, for memory pressure.
var stormdockBin, allocBinary string

func TestMain(m *testing.M) {
	var err error
	if stormdockBin, err = testenv.Build("./cmd/stormdock"); err == nil {
		allocBinary, err = testenv.Build("./e2e/testdata/alloc")
	}
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(1)
	}
	code := m.Run()
	testenv.RemoveBuilds()
	os.Exit(code)
}

// UpdateScreenshotsEnv, set to 1, makes the tests write their screenshots to docs/ (to be
// committed and shown in the manual, docs/console.md); otherwise they go to the test's temporary directory.
const UpdateScreenshotsEnv = "STORMDOCK_UPDATE_SCREENSHOTS"

// chromium finds Debian's chromium (scripts/test installs it when missing).
func chromium(t testing.TB) string {
	t.Helper()
	if p := os.Getenv("STORMDOCK_CHROMIUM"); p != "" {
		return p
	}
	for _, name := range []string{"chromium", "chromium-browser"} {
		if p, err := exec.LookPath(name); err == nil {
			return p
		}
	}
	testenv.Missing(t, "chromium (apt-get install chromium)")
	return ""
}

// browser is one headless chromium for a test; each tab is a browser context of its own,
// so tabs share no storage (a tab logged in as the admin and one as a tenant).
type browser struct {
	t     testing.TB
	alloc context.Context
	root  context.Context
}

func newBrowser(t testing.TB) *browser {
	t.Helper()
	opts := append(chromedp.DefaultExecAllocatorOptions[:],
		chromedp.ExecPath(chromium(t)),
		chromedp.DisableGPU,
		chromedp.Flag("disable-background-networking", true),
		chromedp.Flag("disable-component-update", true),
		chromedp.Flag("disable-sync", true),
		chromedp.Flag("no-first-run", true),
		chromedp.Flag("enable-precise-memory-info", true),
		chromedp.UserDataDir(t.TempDir()),
		chromedp.WindowSize(1440, 1000),
	)
	if os.Geteuid() == 0 {
		opts = append(opts, chromedp.NoSandbox)
	}
	alloc, cancelAlloc := chromedp.NewExecAllocator(context.Background(), opts...)
	root, cancelRoot := chromedp.NewContext(alloc)
	t.Cleanup(func() {
		cancelRoot()
		cancelAlloc()
	})
	// The first run starts the browser; it must not carry a timeout (that would end the
	// browser with it).
	if err := chromedp.Do(root); err != nil {
		t.Fatalf("start chromium: %v", err)
	}
	return &browser{t: t, alloc: alloc, root: root}
}

// pid is the browser's process id.
func (b *browser) pid() int { return chromedp.FromContext(b.root).Browser.Process().Pid }

// tab opens a tab in a fresh browser context.
func (b *browser) tab(t testing.TB) *tab {
	t.Helper()
	// The page's errors and console output go to the test's log.
	listen := chromedp.WithListener(func(ev any) {
		switch ev := ev.(type) {
		case *runtime.EventExceptionThrown:
			t.Logf("browser exception: %s %s", ev.ExceptionDetails.Text, exceptionText(ev.ExceptionDetails))
		case *runtime.EventConsoleAPICalled:
			var args []string
			for _, a := range ev.Args {
				args = append(args, string(a.Value)+a.Description)
			}
			t.Logf("browser console.%s: %s", ev.Type, strings.Join(args, " "))
		}
	})
	ctx, cancel := chromedp.NewContext(b.root, chromedp.WithNewBrowserContext(), listen)
	t.Cleanup(cancel)
	// The first run makes the tab, which lives as long as the context of that run: it
	// carries no timeout.
	if err := chromedp.Do(ctx, chromedp.Navigate("about:blank")); err != nil {
		t.Fatalf("open a tab: %v", err)
	}
	return &tab{t: t, ctx: ctx}
}

type tab struct {
	t   testing.TB
	ctx context.Context
}

// in is the same tab failing test t (a subtest) instead of the one that opened it.
func (p *tab) in(t testing.TB) *tab {
	q := *p
	q.t = t
	return &q
}

// do runs actions, failing the test on an error or after a generous time.
func (p *tab) do(actions ...chromedp.Action[chromedp.Void]) {
	p.t.Helper()
	ctx, cancel := context.WithTimeout(p.ctx, testenv.Timeout(60*time.Second))
	defer cancel()
	if err := chromedp.Do(ctx, actions...); err != nil {
		p.t.Fatalf("browser: %v", err)
	}
}

// eval evaluates a JavaScript expression and decodes its JSON value into out.
func (p *tab) eval(js string, out any) {
	p.t.Helper()
	ctx, cancel := context.WithTimeout(p.ctx, testenv.Timeout(30*time.Second))
	defer cancel()
	raw, err := chromedp.Run(ctx, chromedp.Evaluate[[]byte](js, chromedp.EvalAwaitPromise))
	if err != nil {
		p.t.Fatalf("browser: evaluate %s: %v", js, err)
	}
	if out != nil {
		if err := json.Unmarshal(raw, out); err != nil {
			p.t.Fatalf("browser: evaluate %s: %v (%s)", js, err, raw)
		}
	}
}

func (p *tab) str(js string) string {
	p.t.Helper()
	var s string
	p.eval(js, &s)
	return s
}

func (p *tab) num(js string) int {
	p.t.Helper()
	var n int
	p.eval(js, &n)
	return n
}

// until waits for a JavaScript expression to be true; why, another expression, says what
// the page shows instead, for the failure message.
func (p *tab) until(what string, timeout time.Duration, cond, why string) {
	p.t.Helper()
	testenv.EventuallyWith(p.t, what, timeout, func() (bool, string) {
		var ok bool
		p.eval("!!("+cond+")", &ok)
		if ok || why == "" {
			return ok, ""
		}
		var s any
		p.eval(why, &s)
		return false, fmt.Sprint(s)
	})
}

// open shows a route of the console (#/map, #/job/NAME, ...).
func (p *tab) open(route string) {
	p.t.Helper()
	p.eval(fmt.Sprintf("location.hash = %q, true", route), nil)
	p.until("route "+route, 10*time.Second, fmt.Sprintf("location.hash === %q", route), "")
}

// login opens the console at base and logs in with token.
func (p *tab) login(base, token string) {
	p.t.Helper()
	p.do(chromedp.Navigate(base+"/ui/"),
		chromedp.WaitVisible(chromedp.CSS("#token")),
		chromedp.SendKeys(chromedp.CSS("#token"), token),
		chromedp.Click(chromedp.CSS(`#login-form button[type="submit"]`)))
}

// clickText clicks the button whose text is text, inside the element matched by scope.
func (p *tab) clickText(scope, text string) {
	p.t.Helper()
	js := fmt.Sprintf(`(() => { const b = [...document.querySelectorAll(%q + ' button')].find((b) => b.textContent.trim() === %q && b.offsetParent !== null); if (b) b.click(); return !!b; })()`, scope, text)
	testenv.Eventually(p.t, fmt.Sprintf("button %q in %s", text, scope), 10*time.Second, func() bool {
		var ok bool
		p.eval(js, &ok)
		return ok
	})
}

// confirm fills the confirmation dialog's fields and presses its button.
func (p *tab) confirm(fields map[string]string) {
	p.t.Helper()
	p.until("the confirmation dialog", 10*time.Second, `document.getElementById('confirm').open`, "")
	for name, v := range fields {
		sel := fmt.Sprintf(`#confirm-fields [name=%q]`, name)
		p.do(chromedp.Clear(chromedp.CSS(sel)), chromedp.SendKeys(chromedp.CSS(sel), v))
	}
	p.do(chromedp.Click(chromedp.CSS("#confirm-ok")))
	p.until("the dialog closes after the action", 20*time.Second, `!document.getElementById('confirm').open`,
		`document.getElementById('confirm-error').textContent`)
}

// screenshot takes a PNG of the page into docs/NAME when UpdateScreenshotsEnv is 1, and
// into the test's directory otherwise; either way it checks that it is a readable PNG.
func (p *tab) screenshot(name string) {
	p.t.Helper()
	// Let the last frame paint.
	p.eval(`new Promise((r) => requestAnimationFrame(() => requestAnimationFrame(() => r(true))))`, nil)
	ctx, cancel := context.WithTimeout(p.ctx, testenv.Timeout(30*time.Second))
	defer cancel()
	img, err := chromedp.Run(ctx, chromedp.FullScreenshot(100))
	if err != nil {
		p.t.Fatalf("screenshot %s: %v", name, err)
	}
	cfg, err := png.DecodeConfig(bytes.NewReader(img))
	if err != nil || cfg.Width < 800 {
		p.t.Fatalf("screenshot %s: not a PNG of the page (%v, %dx%d)", name, err, cfg.Width, cfg.Height)
	}
	dir := p.t.TempDir()
	if os.Getenv(UpdateScreenshotsEnv) == "1" {
		dir = filepath.Join("..", "docs")
		if err := os.MkdirAll(dir, 0o755); err != nil {
			p.t.Fatal(err)
		}
	}
	path := filepath.Join(dir, name)
	if err := os.WriteFile(path, img, 0o644); err != nil {
		p.t.Fatal(err)
	}
	p.t.Logf("screenshot %s (%dx%d, %d bytes)", path, cfg.Width, cfg.Height, len(img))
}

// startLocal is a local cluster (internal/clustertest) whose nodes run workers with the
// stormdock binary built for this package.
func startLocal(t testing.TB, cfg daemon.LocalConfig) *clustertest.Local {
	t.Helper()
	return clustertest.StartLocal(t, stormdockBin, cfg)
}

func exceptionText(d *runtime.ExceptionDetails) string {
	if d.Exception != nil {
		return d.Exception.Description
	}
	return fmt.Sprintf("at %s:%d:%d", d.URL, d.LineNumber, d.ColumnNumber)
}
