package main

import (
	"context"
	"encoding/json"
	"flag"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/netip"
	"os"
	"path/filepath"
	"runtime"
	"runtime/pprof"
	"strconv"
	"sync"
	"sync/atomic"
	"time"

	"github.com/inmesh/inmesh/balancer/endpoint"
	"github.com/inmesh/inmesh/controlplane"
	"github.com/inmesh/inmesh/destination"
	"google.golang.org/grpc"
)

// churnTables is how many full tables of new names watch_table sends to
// after the first: metric series outlive the watches a full table
// evicts, so memory plateaus only if what they keep is bounded too, and
// one table's worth of names is too few to show it.
const churnTables = 5

// tableName is the authority of the i-th Service of watch_table.
func tableName(i int) string {
	return fmt.Sprintf("svc-%d.table.svc.cluster.local:80", i)
}

// tableUsage is what the client's process reports after each pass.
type tableUsage struct {
	RSSMiB     float64 `json:"rss_mib"`
	HeapMiB    float64 `json:"heap_mib"`
	StackMiB   float64 `json:"stack_mib"`
	Goroutines int     `json:"goroutines"`
	Watches    int     `json:"watches"`
	Sent       int     `json:"sent"`
	Refused    uint64  `json:"refused"` // watches the client's bound refused, so far
}

// watchTable: the memory of a mesh client (the outbound stack with its
// control-plane client, in a process of its own) with a full table of
// watched names at the default bound: one request to each of as many
// Services as the bound, each of which the client then watches (profile,
// endpoints, policy) on the embedded control plane in this process; then
// churnTables times as many new names, past the bound, to see memory
// plateau. The figure is the client's RSS with the table full; the
// control plane's heap growth is reported beside it.
func watchTable(o options) (*result, error) {
	n := o.scale(destination.DefaultMaxWatches, 500)
	app := &http.Server{Handler: http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) { w.WriteHeader(http.StatusNoContent) }),
		ReadHeaderTimeout: 10 * time.Second}
	appLis, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return nil, err
	}
	go app.Serve(appLis)
	defer app.Close()
	appAddr := netip.MustParseAddrPort(appLis.Addr().String())

	store := controlplane.NewStore()
	sets := make(map[string][]endpoint.Endpoint, (1+churnTables)*n)
	for i := range (1 + churnTables) * n {
		sets[tableName(i)] = []endpoint.Endpoint{{Addr: appAddr}}
	}
	store.SetEndpoints(sets)
	sets = nil
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return nil, err
	}
	srv := grpc.NewServer()
	cp := controlplane.NewServer(store, controlplane.WithLogger(quiet))
	cp.Register(srv)
	go srv.Serve(lis)
	defer func() {
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		_ = cp.Shutdown(ctx)
		srv.Stop()
	}()

	cmd, err := childCommand("watch_table", "-addr", lis.Addr().String(), "-names", strconv.Itoa(n))
	if err != nil {
		return nil, err
	}
	stdin, err := cmd.StdinPipe()
	if err != nil {
		return nil, err
	}
	defer stdin.Close()
	// The control plane's share of this process: its heap and the
	// stacks of its streams' goroutines.
	cpMem := func() float64 {
		for range 4 {
			heap()
		}
		var m runtime.MemStats
		runtime.ReadMemStats(&m)
		return float64(m.HeapAlloc+m.StackInuse) / (1 << 20)
	}
	cpBefore := cpMem()
	proc, err := startChild(cmd, "the client's process")
	if err != nil {
		return nil, err
	}
	defer proc.stop()
	var use [3]tableUsage
	var cpHeap [3]float64
	var cpG [3]int
	for i := range use {
		l, err := proc.next(fmt.Sprintf("the report of pass %d", i), 10*time.Minute)
		if err != nil {
			return nil, err
		}
		if err := json.Unmarshal([]byte(l), &use[i]); err != nil {
			return nil, fmt.Errorf("the client's report %q: %w", l, err)
		}
		cpHeap[i] = cpMem() - cpBefore
		cpG[i] = runtime.NumGoroutine()
		if dir := os.Getenv("INMESH_BENCH_PROFILES"); dir != "" && i == 1 {
			for _, p := range []string{"heap", "goroutine"} {
				if f, err := os.Create(filepath.Join(dir, "watch_table_cp."+p)); err == nil {
					_ = pprof.Lookup(p).WriteTo(f, 1)
					f.Close()
				}
			}
		}
	}
	base, full, again := use[0], use[1], use[2]
	perName := (full.RSSMiB - base.RSSMiB) * 1024 / float64(n)
	r := &result{
		ratio:     ratio{Ratio: full.RSSMiB, Goal: atMost(128), Spread: spread{full.RSSMiB, again.RSSMiB}},
		Unit:      "MiB",
		Candidate: &figures{MiB: full.RSSMiB, Requests: float64(full.Sent + again.Sent)},
		Baseline:  &figures{MiB: base.RSSMiB},
		Rounds:    1,
		Extra:     []ratio{{Name: "control-plane heap+stacks (MiB)", Ratio: cpHeap[1], Goal: atMost(128), Spread: spread{cpHeap[1], cpHeap[2]}}},
	}
	r.Note = fmt.Sprintf("ratio = the client's RSS in MiB with %d names watched (the default bound; %.1f KiB each over %.1f MiB at start); "+
		"after %d more names (%d of %d and %d of %d requests answered, %d watches refused) %.1f MiB, %d watches; %d -> %d goroutines (stacks %.1f MiB), %d watches; heap %.1f -> %.1f MiB; control plane heap and stacks +%.1f MiB (%.1f KiB a name), then +%.1f MiB (goroutines %d, %d, %d)",
		n, perName, base.RSSMiB, churnTables*n, full.Sent, n, again.Sent, churnTables*n, again.Refused, again.RSSMiB, again.Watches, base.Goroutines, full.Goroutines, full.StackMiB, full.Watches, full.HeapMiB, again.HeapMiB, cpHeap[1], cpHeap[1]*1024/float64(n), cpHeap[2], cpG[0], cpG[1], cpG[2])
	return r, nil
}

// watchTableChild is the client's process of watch_table: it reports its
// usage, sends a request to each of the first names, reports, to each of
// churnTables times as many new names, reports, and waits for its
// standard input to end.
func watchTableChild() error {
	fs := flag.NewFlagSet("watch_table", flag.ContinueOnError)
	addr := fs.String("addr", "", "control plane")
	names := fs.Int("names", 0, "names in a full table")
	if err := fs.Parse(os.Args[1:]); err != nil {
		return err
	}
	mp := newMeter()
	defer mp.Shutdown(context.Background())
	dst, err := destination.Dial(*addr, destination.WithLogger(quiet))
	if err != nil {
		return err
	}
	defer dst.Close()
	st := newStack(ok, mp, nil, dst)
	defer st.close()
	report := func(sent int) error {
		runtime.GC()
		var m runtime.MemStats
		runtime.ReadMemStats(&m)
		s := dst.Stats()
		return json.NewEncoder(os.Stdout).Encode(tableUsage{RSSMiB: float64(rss()) / (1 << 20), HeapMiB: float64(m.HeapAlloc) / (1 << 20), StackMiB: float64(m.StackInuse) / (1 << 20),
			Goroutines: runtime.NumGoroutine(), Watches: s.ProfileWatches + s.EndpointWatches + s.PolicyWatches, Sent: sent,
			Refused: s.RejectedWatches})
	}
	pass := func(from, count int) int {
		var next, sent atomic.Int64
		var wg sync.WaitGroup
		deadline := time.Now().Add(5 * time.Minute)
		for range 32 {
			wg.Add(1)
			go func() {
				defer wg.Done()
				for {
					i := int(next.Add(1)) - 1
					if i >= count || time.Now().After(deadline) {
						return
					}
					if answered(st.client, get("http://"+tableName(from+i)+"/", "")) {
						sent.Add(1)
					}
				}
			}()
		}
		wg.Wait()
		return int(sent.Load())
	}
	if err := report(0); err != nil {
		return err
	}
	if err := report(pass(0, *names)); err != nil {
		return err
	}
	if dir := os.Getenv("INMESH_BENCH_PROFILES"); dir != "" {
		// Where a full table's memory and goroutines go.
		for _, p := range []string{"heap", "goroutine"} {
			f, err := os.Create(filepath.Join(dir, "watch_table."+p))
			if err != nil {
				return err
			}
			err = pprof.Lookup(p).WriteTo(f, 1)
			f.Close()
			if err != nil {
				return err
			}
		}
	}
	if err := report(pass(*names, churnTables**names)); err != nil {
		return err
	}
	// Kept until the scenario measured the control plane.
	_, err = io.Copy(io.Discard, os.Stdin)
	return err
}

// answered sends req and reports whether the app answered it (a 2xx): a
// 503 from the stack is not an answer.
func answered(rt http.RoundTripper, req *http.Request) bool {
	code, err := send(rt, req)
	return err == nil && code/100 == 2
}
