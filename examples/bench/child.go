package main

import (
	"fmt"
	"os"
	"os/exec"
)

// childEnv names the part a copy of this binary plays when it runs as a
// child of a scenario (the watchers of fanout, the client of
// watch_table, the workloads and watchers of registration_churn), so
// that what the scenario measures of its own process is the side under
// test alone.
const childEnv = "INMESH_BENCH_CHILD"

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
	if err := run(); err != nil {
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
