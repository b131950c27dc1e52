package destination_test

import (
	"context"
	"fmt"
	"math"
	"net"
	"net/netip"
	"runtime"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/inmesh/inmesh/balancer/endpoint"
	"github.com/inmesh/inmesh/controlplane"
	"github.com/inmesh/inmesh/destination"
	"github.com/inmesh/inmesh/policy"
	"github.com/inmesh/inmesh/profiles"
	"google.golang.org/grpc"
)

// memRate is the heap profile's sampling rate while BenchmarkWatchTable
// runs: about one allocation in 64 bytes, so that the figure is within a
// few percent of the exact one in a fraction of the time.
const memRate = 64

// BenchmarkWatchTable measures what the client holds for each watched
// name (B/name) and each of its three watches (B/watch), with its
// profile, endpoints and policy watched on the embedded control plane and
// answered: the bytes in use that were allocated with the client's code
// on the stack (destination's, and what it calls), from a heap profile.
// The control plane runs in the process too; its allocations are not
// counted. An iteration builds a table of a thousand names: run it with
// -benchtime 1x.
func BenchmarkWatchTable(b *testing.B) {
	const names = 1000
	appAddr := netip.MustParseAddrPort("127.0.0.1:1")
	name := func(i int) string { return fmt.Sprintf("svc-%d.table.svc.cluster.local:80", i) }
	store := controlplane.NewStore()
	sets := make(map[string][]endpoint.Endpoint, names)
	for i := range names {
		sets[name(i)] = []endpoint.Endpoint{{Addr: appAddr}}
	}
	store.SetEndpoints(sets)
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		b.Fatal(err)
	}
	srv := grpc.NewServer()
	controlplane.NewServer(store, controlplane.WithLogger(quietLogger)).Register(srv)
	done := make(chan struct{})
	go func() { defer close(done); _ = srv.Serve(lis) }()
	defer func() { srv.Stop(); <-done }()

	// The rate stays for the rest of the process: the in-use bytes of a
	// profile are scaled by the rate, and would be misread for what was
	// allocated at another.
	runtime.MemProfileRate = memRate
	// table watches the first n names and returns the bytes the client
	// holds, with every watch answered.
	table := func(n int) float64 {
		c, err := destination.Dial(lis.Addr().String(), destination.WithLogger(quietLogger), destination.WithMaxWatches(names))
		if err != nil {
			b.Fatal(err)
		}
		defer c.Close()
		ctx, cancel := context.WithCancel(context.Background())
		defer cancel()
		var wg sync.WaitGroup
		wg.Add(3 * n)
		first := func() func() {
			var once sync.Once
			return func() { once.Do(wg.Done) }
		}
		for i := range n {
			p, e, pol := first(), first(), first()
			if _, err := c.Watch(ctx, name(i), func(profiles.Update) { p() }); err != nil {
				b.Fatal(err)
			}
			if _, err := c.WatchEndpoints(ctx, name(i), func(endpoint.Update) { e() }); err != nil {
				b.Fatal(err)
			}
			if _, err := c.Policies().Watch(ctx, name(i), func(policy.Update) { pol() }); err != nil {
				b.Fatal(err)
			}
		}
		answered := make(chan struct{})
		go func() { wg.Wait(); close(answered) }()
		select {
		case <-answered:
		case <-time.After(time.Minute):
			b.Fatal("the watches were not all answered within a minute")
		}
		return clientInUse()
	}
	// What the first watch of a process builds once (protobuf's tables
	// of each message type) is not the cost of a name.
	table(1)
	base := clientInUse()
	var perName float64
	for b.Loop() {
		perName = (table(names) - base) / names
	}
	b.ReportMetric(perName, "B/name")
	b.ReportMetric(perName/3, "B/watch")
}

// clientInUse returns the bytes in use that were allocated with a frame
// of the destination client's on the stack.
func clientInUse() float64 {
	runtime.GC()
	runtime.GC()
	var recs []runtime.MemProfileRecord
	n, _ := runtime.MemProfile(nil, false)
	for {
		recs = make([]runtime.MemProfileRecord, n+100)
		var ok bool
		if n, ok = runtime.MemProfile(recs, false); ok {
			recs = recs[:n]
			break
		}
	}
	var sum float64
	for _, r := range recs {
		client := false
		frames := runtime.CallersFrames(r.Stack())
		for {
			f, more := frames.Next()
			if strings.HasPrefix(f.Function, "github.com/inmesh/inmesh/controlplane.") {
				client = false // the control plane's use of the package
				break
			}
			client = client || strings.HasPrefix(f.Function, "github.com/inmesh/inmesh/destination.")
			if !more {
				break
			}
		}
		if client && r.InUseObjects() > 0 {
			// Scaled as pprof scales a sampled heap profile.
			size := float64(r.AllocBytes) / float64(r.AllocObjects)
			sum += float64(r.InUseBytes()) / (1 - math.Exp(-size/float64(memRate)))
		}
	}
	return sum
}
