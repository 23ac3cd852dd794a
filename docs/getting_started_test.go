package docs

import (
	"context"
	"encoding/json"
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/stormdock/stormdock/internal/testenv"
)

func TestMain(m *testing.M) {
	code := m.Run()
	testenv.RemoveBuilds()
	os.Exit(code)
}

// block is one fenced block of a markdown page.
type block struct {
	info string // the info string after the opening fence: "sh", "sh daemon", "yaml"...
	line int    // of the opening fence, from 1
	text string
}

// fencedBlocks returns the ``` blocks of a markdown page, in order.
func fencedBlocks(md string) []block {
	var out []block
	var cur *block
	var body []string
	for i, l := range strings.Split(md, "\n") {
		if !strings.HasPrefix(l, "```") {
			if cur != nil {
				body = append(body, l)
			}
			continue
		}
		if cur == nil {
			cur = &block{info: strings.TrimSpace(strings.TrimPrefix(l, "```")), line: i + 1}
			body = nil
			continue
		}
		cur.text = strings.Join(body, "\n")
		out = append(out, *cur)
		cur = nil
	}
	return out
}

// commands are a block's command lines without their comments.
func commands(text string) []string {
	var out []string
	for _, l := range strings.Split(text, "\n") {
		if i := strings.Index(l, " #"); i >= 0 {
			l = l[:i]
		}
		if l = strings.TrimSpace(l); l != "" && !strings.HasPrefix(l, "#") {
			out = append(out, l)
		}
	}
	return out
}

// TestGettingStarted runs every command of getting-started.md, in order, as a reader would:
//
//   - A block marked "sh daemon" holds one long-running command (`stormdock up`): the test
//     starts it in the background with `--api` on a free port and waits until every node it
//     announces is registered; it is stopped with SIGINT (Ctrl-C) at the end.
//   - Every "sh" block is run whole by bash (-e -u -o pipefail, so the first command that
//     fails fails the test), in a scratch directory holding the repository's examples/, with
//     the test's build of stormdock first on PATH and HOME and STORMDOCK_DATA in the scratch
//     directory.
//   - Any other block must hold no stormdock command: a reader copies those too.
func TestGettingStarted(t *testing.T) {
	md, err := os.ReadFile("getting-started.md")
	if err != nil {
		t.Fatal(err)
	}
	blocks := fencedBlocks(string(md))
	var daemons, scripts int
	for _, b := range blocks {
		switch b.info {
		case "sh daemon":
			daemons++
		case "sh":
			scripts++
		default:
			for _, c := range commands(b.text) {
				if strings.HasPrefix(c, "stormdock ") || strings.HasPrefix(c, "$ stormdock ") {
					t.Errorf("getting-started.md:%d: a %q block holds %q, which nothing runs: mark the block sh (run) or sh daemon (started in the background)", b.line, b.info, c)
				}
			}
		}
	}
	if daemons != 1 || scripts == 0 {
		t.Fatalf("getting-started.md has %d sh daemon blocks (want 1: the cluster) and %d sh blocks", daemons, scripts)
	}
	if t.Failed() {
		return
	}

	bin := testenv.BuildBinary(t, "./cmd/stormdock")
	examples, err := filepath.Abs("../examples")
	if err != nil {
		t.Fatal(err)
	}
	dir := t.TempDir()
	if err := os.Symlink(examples, filepath.Join(dir, "examples")); err != nil {
		t.Fatal(err)
	}
	// The data directory's name names the local cluster's cgroups (/stormdock-local/NAME):
	// make it one no other test process's cluster has.
	data := filepath.Join(dir, fmt.Sprintf("docs-%d", os.Getpid()))
	env := append(os.Environ(),
		"PATH="+filepath.Dir(bin)+string(os.PathListSeparator)+os.Getenv("PATH"),
		"HOME="+dir, "STORMDOCK_DATA="+data,
		"STORMDOCK_MASTER=", "STORMDOCK_TOKEN=", "STORMDOCK_CA=")
	for _, b := range blocks {
		switch b.info {
		case "sh daemon":
			startDaemon(t, b, bin, dir, data, env)
		case "sh":
			runScript(t, b, dir, env)
		}
	}
}

// runScript runs a block whole in bash, failing the test with its output if a command fails.
func runScript(t *testing.T, b block, dir string, env []string) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), testenv.Timeout(3*time.Minute))
	defer cancel()
	cmd := exec.CommandContext(ctx, "bash", "-e", "-u", "-o", "pipefail", "-x", "-c", b.text)
	cmd.Dir, cmd.Env = dir, env
	start := time.Now()
	out, err := cmd.CombinedOutput()
	if err != nil {
		t.Fatalf("getting-started.md:%d: the block failed (%v) after %s:\n%s", b.line, err, time.Since(start).Round(time.Millisecond), out)
	}
	t.Logf("getting-started.md:%d: %s\n%s", b.line, time.Since(start).Round(time.Millisecond), out)
}

// announced is how `stormdock up` says how many nodes it runs.
var announced = regexp.MustCompile(`stormdock local cluster: (\d+) nodes`)

// startDaemon starts a block's one command in the background on a free API port, and waits
// until the local cluster it starts has every node it announced registered.
func startDaemon(t *testing.T, b block, bin, dir, data string, env []string) {
	t.Helper()
	cmds := commands(b.text)
	if len(cmds) != 1 || !strings.HasPrefix(cmds[0], "stormdock up") {
		t.Fatalf("getting-started.md:%d: a sh daemon block holds one `stormdock up` command; it holds %q", b.line, cmds)
	}
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	addr := l.Addr().String()
	l.Close()
	cmd := exec.Command("bash", "-c", "exec "+cmds[0]+" --api "+addr+" --log-level warn")
	cmd.Dir, cmd.Env = dir, env
	var out testenv.Buffer
	cmd.Stdout, cmd.Stderr = &out, &out
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	exited := make(chan struct{})
	go func() { _ = cmd.Wait(); close(exited) }()
	t.Cleanup(func() {
		// Ctrl-C, as the page says; a cluster that does not stop within a minute is killed,
		// and its workers with its cgroups.
		_ = cmd.Process.Signal(os.Interrupt)
		select {
		case <-exited:
		case <-time.After(testenv.Timeout(time.Minute)):
			t.Errorf("%s did not stop within a minute of SIGINT:\n%s", cmds[0], out.String())
			_ = cmd.Process.Signal(syscall.SIGKILL)
			<-exited
		}
		if os.Geteuid() == 0 {
			testenv.RemoveCgroupTree("/stormdock-local/" + filepath.Base(data))
		}
	})
	nodes := 0
	testenv.EventuallyWith(t, "the local cluster's nodes registered", 60*time.Second, func() (bool, string) {
		select {
		case <-exited:
			t.Fatalf("getting-started.md:%d: %s exited:\n%s", b.line, cmds[0], out.String())
		default:
		}
		if nodes == 0 {
			m := announced.FindStringSubmatch(out.String())
			if m == nil {
				return false, "no announcement yet"
			}
			nodes, _ = strconv.Atoi(m[1])
		}
		list := exec.Command(bin, "node", "list", "-o", "json")
		list.Dir, list.Env = dir, env
		js, err := list.Output()
		if err != nil {
			return false, fmt.Sprintf("node list: %v", err)
		}
		var got []json.RawMessage
		if err := json.Unmarshal(js, &got); err != nil {
			return false, fmt.Sprintf("node list: %v", err)
		}
		return len(got) == nodes, fmt.Sprintf("%d of %d nodes registered", len(got), nodes)
	})
	t.Logf("getting-started.md:%d: %s --api %s: %d nodes up", b.line, cmds[0], addr, nodes)
}

// TestTourIsGettingStarted checks that every stormdock command of the README's sh blocks is
// one TestGettingStarted runs: the tour is a part of the getting-started page.
func TestTourIsGettingStarted(t *testing.T) {
	page, err := os.ReadFile("getting-started.md")
	if err != nil {
		t.Fatal(err)
	}
	run := map[string]bool{}
	for _, b := range fencedBlocks(string(page)) {
		if b.info == "sh" || b.info == "sh daemon" {
			for _, c := range commands(b.text) {
				run[c] = true
			}
		}
	}
	readme, err := os.ReadFile("../README.md")
	if err != nil {
		t.Fatal(err)
	}
	tour := 0
	for _, b := range fencedBlocks(string(readme)) {
		for _, c := range commands(b.text) {
			if !strings.HasPrefix(c, "stormdock ") {
				continue
			}
			tour++
			if !run[c] {
				t.Errorf("README.md:%d: %q is not a command of getting-started.md, which the docs check runs: add it there", b.line, c)
			}
		}
	}
	if tour == 0 {
		t.Error("README.md has no stormdock command in a fenced block: the tour is gone")
	}
}
