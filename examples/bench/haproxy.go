package main

import (
	"crypto/x509"
	"encoding/pem"
	"errors"
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"syscall"
	"time"

	"github.com/inmesh/inmesh/identity"
)

// haproxy is one HAProxy process, configured as a sidecar would be
// deployed: a thread per core, keep-alive and connection reuse towards
// its server, no logging.
type haproxy struct {
	addr string
	cmd  *exec.Cmd
	dir  string
	done chan struct{} // closed when the process has exited
}

// haproxyGlobal is the part of both sidecars' configuration that is the
// same: one thread per core (nbthread), stopped within a bound
// (hard-stop-after), HTTP keep-alive on both sides, idle server
// connections shared between client connections (http-reuse always).
const haproxyGlobal = `global
  nbthread %[1]d
  maxconn 4096
  hard-stop-after 3s
  ssl-server-verify required

defaults
  mode http
  option http-keep-alive
  http-reuse always
  timeout connect 5s
  timeout client 60s
  timeout server 60s
  timeout http-keep-alive 60s
  timeout http-request 10s
`

// haproxyOutbound is the client's sidecar: plaintext HTTP/1 from the
// application on an inherited listener (fd 3), mTLS to the peer's
// sidecar, verifying its identity (the name in its certificate) and
// presenting the client's own, HTTP/2 when the peer offers it (ALPN).
const haproxyOutbound = `
frontend outbound
  bind fd@3
  default_backend peer

backend peer
  server inbound %[1]s ssl crt %[2]s ca-file %[3]s verify required verifyhost %[4]s sni str(%[4]s) alpn h2
`

// haproxyInbound is the server's sidecar: mTLS on an inherited listener
// (fd 3) requiring a client certificate from the same trust anchor,
// HTTP/2 or HTTP/1 by ALPN, and plaintext HTTP/1 to the application.
const haproxyInbound = `
frontend inbound
  bind fd@3 ssl crt %[2]s ca-file %[3]s verify required alpn h2,http/1.1
  default_backend app

backend app
  server app %[1]s
`

// haproxyPath is where Debian installs HAProxy, outside a user's PATH.
var haproxyPath = "/usr/sbin/haproxy"

// haproxyBin returns HAProxy's path, or an error naming the package to
// install.
func haproxyBin() (string, error) {
	if bin, err := exec.LookPath("haproxy"); err == nil {
		return bin, nil
	}
	if _, err := os.Stat(haproxyPath); err == nil {
		return haproxyPath, nil
	}
	return "", fmt.Errorf("%w (Debian: apt-get install haproxy)", errNoHAProxy)
}

// errNoHAProxy is the error of haproxyBin when HAProxy is not installed.
var errNoHAProxy = errors.New("haproxy is not installed")

// startHAProxy runs HAProxy with conf (the part after haproxyGlobal) in
// dir, on a listener this process opened and hands down as fd 3, so that
// the port is never released and re-bound. The configuration is checked
// first (haproxy -c), so that a mistake is an error naming it. Whether
// HAProxy serves is for the caller to find out; it is stopped by stop.
func startHAProxy(bin, dir, name, conf string) (*haproxy, error) {
	path := filepath.Join(dir, name+".cfg")
	full := fmt.Sprintf(haproxyGlobal, runtime.NumCPU()) + conf
	if err := os.WriteFile(path, []byte(full), 0o644); err != nil {
		return nil, err
	}
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return nil, err
	}
	defer lis.Close()
	f, err := lis.(*net.TCPListener).File()
	if err != nil {
		return nil, err
	}
	defer f.Close()
	check := exec.Command(bin, "-c", "-f", path)
	check.ExtraFiles = []*os.File{f} // fd 3, which the bind names
	if out, err := check.CombinedOutput(); err != nil {
		return nil, fmt.Errorf("haproxy -c %s: %v\n%s", name, err, out)
	}
	h := &haproxy{addr: lis.Addr().String(), dir: dir, done: make(chan struct{})}
	// -db: in the foreground, no master process.
	h.cmd = exec.Command(bin, "-db", "-f", path)
	h.cmd.ExtraFiles = []*os.File{f} // fd 3
	h.cmd.Dir = dir
	h.cmd.Stderr = &tail{max: 4096}
	h.cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true, Pdeathsig: syscall.SIGKILL}
	if err := h.cmd.Start(); err != nil {
		return nil, err
	}
	go func() { _ = h.cmd.Wait(); close(h.done) }()
	running.Lock()
	running.m[h] = true
	running.Unlock()
	return h, nil
}

// exited returns HAProxy's last words if it has exited, else "".
func (h *haproxy) exited() (string, bool) {
	select {
	case <-h.done:
		return fmt.Sprintf("%v: %s", h.cmd.ProcessState, h.cmd.Stderr.(*tail).String()), true
	default:
		return "", false
	}
}

// stop ends HAProxy by its pid: a soft stop (SIGUSR1: it stops listening
// and closes its connections as they go idle, bounded by
// hard-stop-after), SIGKILL to its process group after 10 s.
func (h *haproxy) stop() {
	_ = h.cmd.Process.Signal(syscall.SIGUSR1)
	select {
	case <-h.done:
	case <-time.After(10 * time.Second):
		_ = syscall.Kill(-h.cmd.Process.Pid, syscall.SIGKILL)
		<-h.done
	}
	running.Lock()
	delete(running.m, h)
	running.Unlock()
}

// tail keeps the last max bytes written to it (a process's stderr).
type tail struct {
	max int
	b   []byte
}

func (t *tail) Write(p []byte) (int, error) {
	t.b = append(t.b, p...)
	if len(t.b) > t.max {
		t.b = t.b[len(t.b)-t.max:]
	}
	return len(p), nil
}

func (t *tail) String() string { return string(t.b) }

// writePEM writes local's certificate chain and private key to path, as
// HAProxy's crt takes them: one file, the leaf first.
func writePEM(path string, local *identity.Local) error {
	c := local.Certificate()
	if c == nil {
		return errors.New("no certificate")
	}
	var out []byte
	for _, der := range c.Certificate {
		out = append(out, pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: der})...)
	}
	key, err := x509.MarshalPKCS8PrivateKey(c.PrivateKey)
	if err != nil {
		return err
	}
	out = append(out, pem.EncodeToMemory(&pem.Block{Type: "PRIVATE KEY", Bytes: key})...)
	return os.WriteFile(path, out, 0o600)
}

// writeAnchor writes the trust anchor to path as PEM.
func writeAnchor(path string, root *x509.Certificate) error {
	return os.WriteFile(path, pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: root.Raw}), 0o644)
}
