package main

import (
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"net"
	"net/netip"
	"os"
	"runtime"
	"slices"
	"strconv"
	"sync"
	"time"

	"github.com/inmesh/inmesh/balancer/endpoint"
	"github.com/inmesh/inmesh/controlplane"
	pb "github.com/inmesh/inmesh/proxyapi/destinationpb"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
)

// fanoutName is the authority of the i-th Service of fanout.
func fanoutName(i int) string {
	return fmt.Sprintf("svc-%d.fanout.svc.cluster.local:80", i)
}

// fanoutStamp is the endpoint label that carries the time of a change, in
// Unix nanoseconds, so that a watcher knows how long it took to arrive.
const fanoutStamp = "changed_at"

// fanoutReport is what the watchers' process reports at its end.
type fanoutReport struct {
	Received int     `json:"received"`
	P50      float64 `json:"p50_ns"`
	P99      float64 `json:"p99_ns"`
	Max      float64 `json:"max_ns"`
}

// fanout: 10,000 Destination Get streams on one embedded control plane,
// watching 100 Services, 100 streams each, while the Store changes the
// endpoints of one Service at a time, 100 times a second: the p99 delay
// from a change to its receipt by the watchers (in another process, so
// that this process's CPU time is the control plane's alone), and the
// control plane's CPU share.
func fanout(o options) (*result, error) {
	streams, services := o.scale(10000, 1000), o.scale(100, 10)
	const rate = 100 // changes a second
	period := time.Duration(o.scale(10, 3)) * time.Second

	store := controlplane.NewStore()
	stamp := func(i int) []endpoint.Endpoint {
		return []endpoint.Endpoint{{Addr: netip.AddrPortFrom(netip.AddrFrom4([4]byte{127, 0, byte(i >> 8), byte(i)}), 8080),
			Labels: map[string]string{fanoutStamp: strconv.FormatInt(time.Now().UnixNano(), 10)}}}
	}
	for i := range services {
		store.PutEndpoints(fanoutName(i), stamp(0))
	}
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

	cmd, err := childCommand("fanout", "-addr", lis.Addr().String(),
		"-streams", strconv.Itoa(streams), "-services", strconv.Itoa(services))
	if err != nil {
		return nil, err
	}
	stdin, err := cmd.StdinPipe()
	if err != nil {
		return nil, err
	}
	proc, err := startChild(cmd, "the watchers' process")
	if err != nil {
		return nil, err
	}
	defer proc.stop()
	if err := proc.ready(3 * time.Minute); err != nil {
		return nil, err
	}

	runtime.GC()
	cpu0, t0 := cpuTime(), time.Now()
	tick := time.NewTicker(time.Second / rate)
	changes := 0
	for time.Since(t0) < period {
		<-tick.C
		changes++
		store.PutEndpoints(fanoutName(changes%services), stamp(changes))
	}
	tick.Stop()
	changedFor := time.Since(t0)
	cpu := cpuTime() - cpu0
	// The last changes' receipts, then the report.
	time.Sleep(time.Second)
	_ = stdin.Close()
	l, err := proc.next("report", time.Minute)
	if err != nil {
		return nil, err
	}
	var rep fanoutReport
	if err := json.Unmarshal([]byte(l), &rep); err != nil {
		return nil, fmt.Errorf("the watchers' report %q: %w", l, err)
	}
	want := changes * (streams / services)
	p99ms := rep.P99 / 1e6
	share := cpu.Seconds() / changedFor.Seconds()
	r := &result{
		ratio:     ratio{Ratio: p99ms, Goal: atMost(50), Spread: spread{p99ms, p99ms}},
		Unit:      "ms",
		Candidate: &figures{P50: rep.P50, P99: rep.P99, Requests: float64(rep.Received), RPS: float64(changes) / changedFor.Seconds()},
		Rounds:    1,
		Extra: []ratio{{Name: "control-plane CPU (cores)", Ratio: share, Goal: noGoal, Spread: spread{share, share},
			Note: fmt.Sprintf("%.1f%% of %d cores", 100*share/float64(runtime.NumCPU()), runtime.NumCPU())}},
	}
	r.Note = fmt.Sprintf("ratio = p99 ms from a change to its receipt (p50 %.1f ms, max %.1f ms); %d streams on %d Services; %d changes in %v; %d of %d updates received; control plane %.2f cores",
		rep.P50/1e6, rep.Max/1e6, streams, services, changes, changedFor.Round(100*time.Millisecond), rep.Received, want, share)
	return r, nil
}

// fanoutChild is the watchers' process of fanout: it opens its streams,
// says "ready" once each had its first update, records the delay of every
// later update from the time its endpoint carries, and prints its report
// when its standard input ends.
func fanoutChild() error {
	fs := flag.NewFlagSet("fanout", flag.ContinueOnError)
	addr := fs.String("addr", "", "control plane")
	streams := fs.Int("streams", 0, "streams to open")
	services := fs.Int("services", 0, "Services they watch")
	if err := fs.Parse(os.Args[1:]); err != nil {
		return err
	}
	const conns = 16
	clients := make([]pb.DestinationClient, conns)
	for i := range clients {
		cc, err := grpc.NewClient(*addr, grpc.WithTransportCredentials(insecure.NewCredentials()))
		if err != nil {
			return err
		}
		defer cc.Close()
		clients[i] = pb.NewDestinationClient(cc)
	}
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	var (
		mu     sync.Mutex
		delays []float64
		failed error
	)
	var ready sync.WaitGroup
	for i := range *streams {
		ready.Add(1)
		go func() {
			st, err := clients[i%conns].Get(ctx, &pb.GetDestination{Path: fanoutName(i % *services)})
			first := true
			for err == nil {
				var u *pb.Update
				if u, err = st.Recv(); err != nil {
					break
				}
				now := time.Now().UnixNano()
				if first {
					first = false
					ready.Done()
					continue
				}
				for _, a := range u.GetAdd().GetAddrs() {
					if t, perr := strconv.ParseInt(a.GetMetricLabels()[fanoutStamp], 10, 64); perr == nil {
						mu.Lock()
						delays = append(delays, float64(now-t))
						mu.Unlock()
					}
				}
			}
			if first {
				mu.Lock()
				failed = errors.Join(failed, err)
				mu.Unlock()
				ready.Done()
			}
		}()
	}
	ready.Wait()
	if failed != nil {
		return failed
	}
	fmt.Println("ready")
	_, _ = io.Copy(io.Discard, os.Stdin)
	stopChildProfile()
	mu.Lock()
	defer mu.Unlock()
	rep := fanoutReport{Received: len(delays)}
	if len(delays) > 0 {
		slices.Sort(delays)
		at := func(q float64) float64 { return delays[min(len(delays)-1, int(q*float64(len(delays))))] }
		rep.P50, rep.P99, rep.Max = at(0.50), at(0.99), delays[len(delays)-1]
	}
	return json.NewEncoder(os.Stdout).Encode(rep)
}
