package testenv

import (
	"encoding/base64"
	"encoding/json"
	"fmt"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"golang.org/x/crypto/bcrypt"
)

// RegistryEnv names the variable scripts/test exports with the address (127.0.0.1:PORT) of
// the registry it started.
const RegistryEnv = "STORMDOCK_REGISTRY"

// Registry returns the address of the shared image registry scripts/test starts from
// Debian's docker-registry (STORMDOCK_REGISTRY), after checking that it answers. Images
// pushed to it are named ADDR/NAME:TAG; dockerd pulls from a loopback registry without TLS.
func Registry(t testing.TB) string {
	t.Helper()
	addr := os.Getenv(RegistryEnv)
	if addr == "" {
		Missing(t, "image registry: %s is not set (scripts/test starts one from Debian's docker-registry)", RegistryEnv)
		return ""
	}
	if err := registryAnswers(addr); err != nil {
		Missing(t, "image registry at %s (%s): %v", addr, RegistryEnv, err)
	}
	return addr
}

func registryAnswers(addr string) error {
	cl := &http.Client{Timeout: 2 * time.Second}
	resp, err := cl.Get("http://" + addr + "/v2/")
	if err != nil {
		return err
	}
	resp.Body.Close()
	if resp.StatusCode != http.StatusOK && resp.StatusCode != http.StatusUnauthorized {
		return fmt.Errorf("GET /v2/ answers %s", resp.Status)
	}
	return nil
}

// RegistryServer is a registry of a test's own, for tests that stop it or need credentials.
type RegistryServer struct {
	// Addr is 127.0.0.1:PORT; it stays the same across Stop and Start.
	Addr string
	t    testing.TB
	bin  string
	dir  string

	mu  sync.Mutex
	cmd *exec.Cmd
}

// StartRegistry starts Debian's docker-registry on a free loopback port with storage in a
// temporary directory. With users (name -> password) it asks for basic auth (htpasswd). It is
// stopped at the end of the test.
func StartRegistry(t testing.TB, users map[string]string) *RegistryServer {
	t.Helper()
	bin := os.Getenv("STORMDOCK_REGISTRY_BIN")
	if bin == "" {
		bin = "/usr/bin/docker-registry"
	}
	if _, err := os.Stat(bin); err != nil {
		Missing(t, "docker-registry binary: %v (apt-get install docker-registry)", err)
	}
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	addr := ln.Addr().String()
	ln.Close()
	dir := t.TempDir()
	cfg := fmt.Sprintf("version: 0.1\nlog:\n  level: warn\nstorage:\n  filesystem:\n    rootdirectory: %s\n  delete:\n    enabled: true\nhttp:\n  addr: %s\n",
		filepath.Join(dir, "data"), addr)
	if len(users) > 0 {
		var lines []string
		for u, p := range users {
			h, err := bcrypt.GenerateFromPassword([]byte(p), bcrypt.MinCost)
			if err != nil {
				t.Fatal(err)
			}
			lines = append(lines, u+":"+string(h))
		}
		if err := os.WriteFile(filepath.Join(dir, "htpasswd"), []byte(strings.Join(lines, "\n")+"\n"), 0o600); err != nil {
			t.Fatal(err)
		}
		cfg += fmt.Sprintf("auth:\n  htpasswd:\n    realm: stormdock-test\n    path: %s\n", filepath.Join(dir, "htpasswd"))
	}
	if err := os.WriteFile(filepath.Join(dir, "config.yml"), []byte(cfg), 0o600); err != nil {
		t.Fatal(err)
	}
	r := &RegistryServer{Addr: addr, t: t, bin: bin, dir: dir}
	r.Start()
	t.Cleanup(r.Stop)
	return r
}

// Start starts the registry (again) and waits until it answers.
func (r *RegistryServer) Start() {
	r.t.Helper()
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.cmd != nil {
		return
	}
	log, err := os.OpenFile(filepath.Join(r.dir, "registry.log"), os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o600)
	if err != nil {
		r.t.Fatal(err)
	}
	cmd := exec.Command(r.bin, "serve", filepath.Join(r.dir, "config.yml"))
	cmd.Stdout, cmd.Stderr = log, log
	if err := cmd.Start(); err != nil {
		log.Close()
		r.t.Fatalf("start docker-registry: %v", err)
	}
	log.Close()
	r.cmd = cmd
	deadline := time.Now().Add(Timeout(15 * time.Second))
	for registryAnswers(r.Addr) != nil {
		if time.Now().After(deadline) {
			b, _ := os.ReadFile(filepath.Join(r.dir, "registry.log"))
			r.t.Fatalf("docker-registry on %s does not answer:\n%s", r.Addr, b)
		}
		time.Sleep(50 * time.Millisecond)
	}
}

// Stop stops the registry; its storage stays for the next Start.
func (r *RegistryServer) Stop() {
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.cmd == nil {
		return
	}
	_ = r.cmd.Process.Signal(syscall.SIGTERM)
	done := make(chan struct{})
	go func() { _ = r.cmd.Wait(); close(done) }()
	select {
	case <-done:
	case <-time.After(5 * time.Second):
		_ = r.cmd.Process.Kill()
		<-done
	}
	r.cmd = nil
}

// AuthFile writes a Docker config.json with one credential for the registry and returns its
// path.
func (r *RegistryServer) AuthFile(user, password string) string {
	r.t.Helper()
	return WriteAuthFile(r.t, r.Addr, user, password)
}

// WriteAuthFile writes a Docker config.json (mode 0600) giving user:password for host.
func WriteAuthFile(t testing.TB, host, user, password string) string {
	t.Helper()
	b, _ := json.Marshal(map[string]any{"auths": map[string]any{
		host: map[string]string{"auth": base64.StdEncoding.EncodeToString([]byte(user + ":" + password))},
	}})
	p := filepath.Join(t.TempDir(), "config.json")
	if err := os.WriteFile(p, b, 0o600); err != nil {
		t.Fatal(err)
	}
	return p
}
