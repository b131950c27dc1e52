package main

import (
	"errors"
	"fmt"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"sync"
	"syscall"
	"time"
)

// nginx is one nginx process in front of an upstream, configured as a
// sidecar would be: one worker, keep-alive to the upstream, no access log.
type nginx struct {
	addr string
	cmd  *exec.Cmd
	dir  string
}

const nginxConf = `worker_processes 1;
daemon off;
master_process on;
pid %[1]s/nginx.pid;
error_log %[1]s/error.log warn;
events { worker_connections 4096; }
http {
  access_log off;
  client_body_temp_path %[1]s/body;
  proxy_temp_path %[1]s/proxy;
  fastcgi_temp_path %[1]s/fastcgi;
  uwsgi_temp_path %[1]s/uwsgi;
  scgi_temp_path %[1]s/scgi;
  upstream backend {
    server %[2]s;
    keepalive 64;
  }
  server {
    listen %[3]s;
    keepalive_requests 10000000;
    location / {
      proxy_pass http://backend;
      proxy_http_version 1.1;
      proxy_set_header Connection "";
      proxy_set_header Host $http_host;
    }
  }
}
`

// startNginx runs nginx from PATH in front of upstream, on a listener this
// process opened and hands down (nginx's NGINX variable names inherited
// sockets), so that the port is never released and re-bound. It returns
// an error when nginx is not installed.
func startNginx(upstream string) (*nginx, error) {
	bin, err := exec.LookPath("nginx")
	if err != nil {
		if _, serr := os.Stat("/usr/sbin/nginx"); serr != nil {
			return nil, errors.New("nginx is not installed (Debian: apt-get install nginx-light)")
		}
		bin = "/usr/sbin/nginx"
	}
	dir, err := os.MkdirTemp("", "inmesh-bench-nginx-")
	if err != nil {
		return nil, err
	}
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		os.RemoveAll(dir)
		return nil, err
	}
	defer lis.Close()
	f, err := lis.(*net.TCPListener).File()
	if err != nil {
		os.RemoveAll(dir)
		return nil, err
	}
	defer f.Close()
	n := &nginx{addr: lis.Addr().String(), dir: dir}
	conf := filepath.Join(dir, "nginx.conf")
	if err := os.WriteFile(conf, []byte(fmt.Sprintf(nginxConf, dir, upstream, n.addr)), 0o644); err != nil {
		os.RemoveAll(dir)
		return nil, err
	}
	n.cmd = exec.Command(bin, "-p", dir, "-e", filepath.Join(dir, "error.log"), "-c", conf)
	n.cmd.ExtraFiles = []*os.File{f} // fd 3
	n.cmd.Env = append(os.Environ(), "NGINX=3;")
	n.cmd.Dir = dir
	// Its own process group, so that the master and its worker are
	// stopped together; killed with this process if it dies first.
	n.cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true, Pdeathsig: syscall.SIGKILL}
	if err := n.cmd.Start(); err != nil {
		os.RemoveAll(dir)
		return nil, err
	}
	running.Lock()
	running.m[n] = true
	running.Unlock()
	// Ready when a request goes through.
	c := &http.Client{Transport: h1Transport(), Timeout: time.Second}
	defer c.CloseIdleConnections()
	deadline := time.Now().Add(10 * time.Second)
	for {
		resp, err := c.Get("http://" + n.addr + "/")
		if err == nil {
			resp.Body.Close()
			if resp.StatusCode == 200 {
				return n, nil
			}
		}
		if time.Now().After(deadline) {
			log, _ := os.ReadFile(filepath.Join(dir, "error.log"))
			n.stop()
			return nil, fmt.Errorf("nginx did not come up: %v\n%s", err, log)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// stopper is a process the bench started (nginx, HAProxy).
type stopper interface{ stop() }

// running is every process started and not yet stopped, for stopAll.
var running = struct {
	sync.Mutex
	m map[stopper]bool
}{m: map[stopper]bool{}}

// stopAll stops every nginx and HAProxy still running (on an interrupt).
func stopAll() {
	running.Lock()
	ns := make([]stopper, 0, len(running.m))
	for n := range running.m {
		ns = append(ns, n)
	}
	running.Unlock()
	for _, n := range ns {
		n.stop()
	}
}

// stop ends nginx by its pid (graceful QUIT, KILL after 5 s) and removes
// its directory.
func (n *nginx) stop() {
	_ = n.cmd.Process.Signal(syscall.SIGQUIT)
	done := make(chan struct{})
	go func() { _ = n.cmd.Wait(); close(done) }()
	select {
	case <-done:
	case <-time.After(5 * time.Second):
		// The master and its worker are one process group.
		_ = syscall.Kill(-n.cmd.Process.Pid, syscall.SIGKILL)
		<-done
	}
	os.RemoveAll(n.dir)
	running.Lock()
	delete(running.m, n)
	running.Unlock()
}
