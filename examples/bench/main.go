// Command bench measures inmesh side by side with what it replaces: each
// scenario runs a baseline (bare net/http, otelhttp, an HTTP/1 pool, a
// sidecar hop) and a candidate (an inmesh stack) interleaved in one
// process, several rounds, and reports the median of the per-round ratios
// with their spread.
//
//	go run ./examples/bench              # the table, about 5 minutes on 2 idle cores
//	go run ./examples/bench -json        # one JSON object per scenario
//	go run ./examples/bench -short -only stack_inprocess,upgrade_64
//
// Everything runs on 127.0.0.1. sidecar_hop (and the nginx variants of
// mesh_64) need nginx (Debian's nginx-light) on PATH, sidecar_pair needs
// HAProxy (Debian's haproxy); each is skipped with a note without it. See
// BENCHMARKS.md at the repository root for what each figure means.
package main

import (
	"encoding/json"
	"flag"
	"fmt"
	"io"
	"log/slog"
	"os"
	"os/signal"
	"runtime"
	"runtime/pprof"
	"strings"
	"syscall"
	"time"
)

type options struct {
	rounds int
	short  bool
	json   bool
	only   map[string]bool
}

// scale returns full, or short under -short.
func (o options) scale(full, short int) int {
	if o.short {
		return short
	}
	return full
}

// roundsAtMost caps the rounds of a scenario whose rounds are long (they
// wait on timers: stalls, delays, budgets) and whose per-round figure is
// steady, so that a full run stays within a few minutes.
func (o options) roundsAtMost(n int) int { return min(o.rounds, n) }

type scenario struct {
	name string
	run  func(options) (*result, error)
}

var scenarios = []scenario{
	{"stack_inprocess", stackInProcess},
	{"stack_loopback", stackLoopback},
	{"mtls_loopback", mtlsLoopback},
	{"inbound_policy", inboundPolicy},
	{"sidecar_hop", sidecarHop},
	{"sidecar_pair", sidecarPair},
	{"upgrade_64", upgrade64},
	{"upgrade_serial", upgradeSerial},
	{"mesh_64", mesh64},
	{"profile_swap", profileSwap},
	{"retry_budget", retryBudget},
	{"endpoints_1000", endpoints1000},
	{"host_flood", hostFlood},
	{"grpc_unary", grpcUnary},
	{"grpc_stream", grpcStream},
	{"tap", tapViewer},
	{"fanout", fanout},
	{"watch_table", watchTable},
	{"registration_churn", registrationChurn},
	{"failover", failover},
	{"hedge_tail", hedgeTail},
	{"zone_spill", zoneSpill},
	{"mirror", mirrorBench},
	{"outlier", outlierBench},
	{"tracing", tracingLoopback},
}

func main() {
	runChild()
	var o options
	var only string
	flag.IntVar(&o.rounds, "rounds", 0, "rounds per scenario (default 9, 3 with -short)")
	flag.BoolVar(&o.short, "short", false, "smaller runs, for a quick look")
	flag.BoolVar(&o.json, "json", false, "print a JSON array instead of the table")
	flag.StringVar(&only, "only", "", "comma-separated scenario names to run (default all)")
	cpuprofile := flag.String("cpuprofile", "", "write a CPU profile of the whole run to this file")
	childProfile := flag.String("childcpuprofile", "", "write a CPU profile of the scenarios' child processes (fanout's watchers, ...) to this file, each child overwriting the last")
	flag.Parse()
	if *childProfile != "" {
		// Children inherit the environment (childCommand).
		_ = os.Setenv(childProfileEnv, *childProfile)
	}
	if o.rounds <= 0 {
		o.rounds = o.scale(9, 3)
	}
	o.only = map[string]bool{}
	for _, n := range strings.Split(only, ",") {
		if n = strings.TrimSpace(n); n != "" {
			o.only[n] = true
		}
	}
	for n := range o.only {
		if !known(n) {
			fmt.Fprintf(os.Stderr, "bench: -only: unknown scenario %q\n", n)
			os.Exit(2)
		}
	}
	// The library logs through slog.Default in places; nothing it says
	// under load belongs in the table.
	slog.SetDefault(slog.New(slog.NewTextHandler(io.Discard, nil)))

	// An interrupt stops the nginx and HAProxy processes this run
	// started before exiting.
	sig := make(chan os.Signal, 1)
	signal.Notify(sig, os.Interrupt, syscall.SIGTERM)
	go func() {
		<-sig
		stopAll()
		os.Exit(130)
	}()
	if *cpuprofile != "" {
		f, err := os.Create(*cpuprofile)
		if err == nil {
			err = pprof.StartCPUProfile(f)
		}
		if err != nil {
			fmt.Fprintln(os.Stderr, "bench: -cpuprofile:", err)
			os.Exit(2)
		}
		defer f.Close()
		defer pprof.StopCPUProfile()
	}
	start := time.Now()
	var results []*result
	for _, s := range scenarios {
		if len(o.only) > 0 && !o.only[s.name] {
			continue
		}
		fmt.Fprintf(os.Stderr, "bench: %s ...", s.name)
		t0 := time.Now()
		r, err := s.run(o)
		if err != nil {
			r = &result{}
			r.Note = "error: " + err.Error()
		}
		r.Name = s.name
		if r.Rounds == 0 && r.Skipped == "" && err == nil {
			r.Rounds = o.rounds
		}
		r.finish()
		fmt.Fprintf(os.Stderr, " %v\n", time.Since(t0).Round(100*time.Millisecond))
		results = append(results, r)
		runtime.GC()
	}
	if o.json {
		enc := json.NewEncoder(os.Stdout)
		enc.SetIndent("", "  ")
		enc.SetEscapeHTML(false)
		if err := enc.Encode(results); err != nil {
			fmt.Fprintln(os.Stderr, "bench:", err)
			os.Exit(1)
		}
	} else {
		printTable(os.Stdout, results)
	}
	fmt.Fprintf(os.Stderr, "bench: %d scenarios in %v (GOMAXPROCS %d, %s)\n",
		len(results), time.Since(start).Round(time.Second), runtime.GOMAXPROCS(0), runtime.Version())
}

func known(name string) bool {
	for _, s := range scenarios {
		if s.name == name {
			return true
		}
	}
	return false
}
