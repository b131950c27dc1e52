package main

import (
	"bufio"
	"fmt"
	"os"
	"os/exec"
	"runtime/pprof"
	"sync"
	"time"
)

// childEnv names the part a copy of this binary plays when it runs as a
// child of a scenario (the watchers of fanout, the client of
// watch_table, the workloads and watchers of registration_churn), so
// that what the scenario measures of its own process is the side under
// test alone.
const childEnv = "INMESH_BENCH_CHILD"

// childProfileEnv names the file a child writes its CPU profile to (the
// -childcpuprofile flag), when set.
const childProfileEnv = "INMESH_BENCH_CHILD_CPUPROFILE"

// stopChildProfile ends the child's CPU profile, if one runs; a child
// calls it before its last report, after which the scenario may kill it.
var stopChildProfile = func() {}

// children are the parts a child can play, by name.
var children = map[string]func() error{
	"fanout":             fanoutChild,
	"watch_table":        watchTableChild,
	"registration_churn": churnChild,
}

// runChild plays the part that childEnv names, if any, and exits.
func runChild() {
	part := os.Getenv(childEnv)
	if part == "" {
		return
	}
	run, ok := children[part]
	if !ok {
		fmt.Fprintf(os.Stderr, "bench: %s: unknown part %q\n", childEnv, part)
		os.Exit(2)
	}
	if path := os.Getenv(childProfileEnv); path != "" {
		f, err := os.Create(path)
		if err == nil {
			err = pprof.StartCPUProfile(f)
		}
		if err != nil {
			fmt.Fprintln(os.Stderr, "bench child: -childcpuprofile:", err)
			os.Exit(2)
		}
		var once sync.Once
		stopChildProfile = func() {
			once.Do(func() {
				pprof.StopCPUProfile()
				_ = f.Close()
			})
		}
	}
	err := run()
	stopChildProfile()
	if err != nil {
		fmt.Fprintln(os.Stderr, "bench child:", err)
		os.Exit(1)
	}
	os.Exit(0)
}

// childCommand returns a command running this binary as the child part,
// with args (read by the child from its own os.Args).
func childCommand(part string, args ...string) (*exec.Cmd, error) {
	exe, err := os.Executable()
	if err != nil {
		return nil, err
	}
	cmd := exec.Command(exe, args...)
	cmd.Env = append(os.Environ(), childEnv+"="+part)
	cmd.Stderr = os.Stderr
	return cmd, nil
}

// child is a running child part whose standard output is read line by
// line: the parts report "ready" and their figures one line each.
type child struct {
	cmd   *exec.Cmd
	who   string // the part, as errors name it
	lines chan string
	done  chan struct{}
}

// startChild starts cmd (made by childCommand, its other pipes set) and
// reads its output; who names it in errors. Stop ends it.
func startChild(cmd *exec.Cmd, who string) (*child, error) {
	stdout, err := cmd.StdoutPipe()
	if err != nil {
		return nil, err
	}
	if err := cmd.Start(); err != nil {
		return nil, err
	}
	c := &child{cmd: cmd, who: who, lines: make(chan string, 4), done: make(chan struct{})}
	go func() {
		defer close(c.lines)
		s := bufio.NewScanner(stdout)
		s.Buffer(nil, 1<<20)
		for s.Scan() {
			select {
			case c.lines <- s.Text():
			case <-c.done:
				return
			}
		}
	}()
	return c, nil
}

// next returns the child's next line, what it stands for naming it in
// the error when the child ends or says nothing within timeout.
func (c *child) next(what string, timeout time.Duration) (string, error) {
	select {
	case l, ok := <-c.lines:
		if !ok {
			return "", fmt.Errorf("%s ended before %s", c.who, what)
		}
		return l, nil
	case <-time.After(timeout):
		return "", fmt.Errorf("%s: no %s within %v", c.who, what, timeout)
	}
}

// ready waits for the child's "ready" line.
func (c *child) ready(timeout time.Duration) error {
	l, err := c.next("ready", timeout)
	if err == nil && l != "ready" {
		err = fmt.Errorf("%s said %q", c.who, l)
	}
	return err
}

// stop kills the child and waits for it.
func (c *child) stop() {
	close(c.done)
	_ = c.cmd.Process.Kill()
	_ = c.cmd.Wait()
}
