package main

import (
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
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
	"github.com/inmesh/inmesh/registration"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
)

// churnName is the authority of the i-th Service of registration_churn.
func churnName(i int) string {
	return fmt.Sprintf("svc-%d.churn.svc.cluster.local:8080", i)
}

// churnAddr is the address the i-th workload registers (nothing listens
// there: the watchers only read it).
func churnAddr(i int) netip.AddrPort {
	return netip.AddrPortFrom(netip.AddrFrom4([4]byte{10, byte(i >> 16), byte(i >> 8), byte(i)}), 8080)
}

// churnConfig is the size of one registration_churn run.
type churnConfig struct {
	workloads int           // workloads that register, each once
	services  int           // Services they register for, in turn
	watchers  int           // Destination Get streams, spread over the Services
	rate      int           // registrations started a second
	life      time.Duration // how long each stays registered once accepted
}

// churnReport is what the workloads' and watchers' process reports.
type churnReport struct {
	Registered   int `json:"registered"`   // workloads accepted
	Deregistered int `json:"deregistered"` // workloads whose Deregister returned
	// Expected is the adds (and as many removes) the watchers should
	// see: each workload by every watcher of its Service.
	Expected int `json:"expected"`
	Adds     int `json:"adds"`
	Removes  int `json:"removes"`
	// From Register to seen in a watcher's answer, and from Deregister
	// to its removal seen, in ns.
	AddP50    float64 `json:"add_p50_ns"`
	AddP99    float64 `json:"add_p99_ns"`
	AddMax    float64 `json:"add_max_ns"`
	RemoveP50 float64 `json:"remove_p50_ns"`
	RemoveP99 float64 `json:"remove_p99_ns"`
	RemoveMax float64 `json:"remove_max_ns"`
	// From Register to the control plane's acceptance, in ns.
	AcceptP99 float64 `json:"accept_p99_ns"`
	Seconds   float64 `json:"seconds"` // from the first registration to the last removal seen
}

// registrationChurn: workloads register with the embedded control plane
// (package registration, insecure registration, the Store's memory as
// the registry) and leave, while Destination Get streams watch their
// Services: the p99 from a workload's Register to its endpoint in a
// watcher's answer, the same for its departure, whether every one was
// seen, and the control plane's CPU. The workloads and the watchers are
// one child process, so that this process's CPU time is the control
// plane's alone and both ends of a delay are read from one clock.
func registrationChurn(o options) (*result, error) {
	cfg := churnConfig{workloads: o.scale(1000, 200), services: o.scale(10, 5), watchers: o.scale(100, 20),
		rate: 100, life: time.Duration(o.scale(2000, 500)) * time.Millisecond}
	rep, cpu, err := runChurn(cfg)
	if err != nil {
		return nil, err
	}
	lost := float64(2*rep.Expected - rep.Adds - rep.Removes)
	addMS, removeMS := rep.AddP99/1e6, rep.RemoveP99/1e6
	cores := cpu.Seconds() / rep.Seconds
	perEvent := cpu.Seconds() / float64(2*cfg.workloads) * 1e6
	one := func(name string, v float64, g goal, note string) ratio {
		return ratio{Name: name, Ratio: v, Goal: g, Spread: spread{v, v}, Note: note}
	}
	r := &result{
		ratio:     one("", addMS, atMost(100), ""),
		Unit:      "ms",
		Candidate: &figures{P50: rep.AddP50, P99: rep.AddP99, Requests: float64(rep.Adds + rep.Removes)},
		Rounds:    1,
		Extra: []ratio{
			one("departure p99 (ms): Deregister to removal seen", removeMS, atMost(100), ""),
			one("lost: registrations or departures a watcher never saw", lost, atMost(0), ""),
			one("control-plane CPU (cores)", cores, noGoal,
				fmt.Sprintf("%.1f%% of %d cores; %.0f µs per registration or departure", 100*cores/float64(runtime.NumCPU()), runtime.NumCPU(), perEvent)),
		},
	}
	r.Note = fmt.Sprintf("ratio = p99 ms from Register to the endpoint in a watcher's answer (p50 %.1f ms, max %.1f ms; accepted p99 %.1f ms); departures p50 %.1f ms, p99 %.1f ms, max %.1f ms; "+
		"%d workloads (%d a second, each registered %v) on %d Services, %d watchers; %d of %d adds and %d of %d removes seen; %d registered, %d deregistered; control plane %.2f cores over %.1f s",
		rep.AddP50/1e6, rep.AddMax/1e6, rep.AcceptP99/1e6, rep.RemoveP50/1e6, removeMS, rep.RemoveMax/1e6,
		cfg.workloads, cfg.rate, cfg.life, cfg.services, cfg.watchers, rep.Adds, rep.Expected, rep.Removes, rep.Expected,
		rep.Registered, rep.Deregistered, cores, rep.Seconds)
	return r, nil
}

// runChurn serves the control plane in this process, runs the workloads
// and watchers of cfg in a child, and returns the child's report and this
// process's CPU time while they ran.
func runChurn(cfg churnConfig) (*churnReport, time.Duration, error) {
	store := controlplane.NewStore()
	// Each Service has one endpoint of its own, as an endpoints file
	// gives it: the Service exists for Get, and a watcher's first
	// answer (that endpoint) says it is watching.
	sets := make(map[string][]endpoint.Endpoint, cfg.services)
	for i := range cfg.services {
		sets[churnName(i)] = []endpoint.Endpoint{{Addr: netip.AddrPortFrom(netip.AddrFrom4([4]byte{192, 0, 2, byte(i)}), 8080)}}
	}
	store.SetEndpoints(sets)
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return nil, 0, err
	}
	srv := grpc.NewServer()
	// Every workload registers from 127.0.0.1 without an identity: one
	// slot, which must hold them all.
	cp := controlplane.NewServer(store, controlplane.WithLogger(quiet), controlplane.WithInsecureRegistration(),
		controlplane.WithRegistrationLimits(0, cfg.workloads+1))
	cp.Register(srv)
	go srv.Serve(lis)
	defer func() {
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		_ = cp.Shutdown(ctx)
		srv.Stop()
	}()

	cmd, err := childCommand("registration_churn", "-addr", lis.Addr().String(),
		"-workloads", strconv.Itoa(cfg.workloads), "-services", strconv.Itoa(cfg.services),
		"-watchers", strconv.Itoa(cfg.watchers), "-rate", strconv.Itoa(cfg.rate), "-life", cfg.life.String())
	if err != nil {
		return nil, 0, err
	}
	proc, err := startChild(cmd, "the workloads' process")
	if err != nil {
		return nil, 0, err
	}
	defer proc.stop()
	if err := proc.ready(2 * time.Minute); err != nil {
		return nil, 0, err
	}
	cpu0 := cpuTime()
	run := time.Duration(cfg.workloads/cfg.rate)*time.Second + cfg.life
	l, err := proc.next("report", run+3*time.Minute)
	if err != nil {
		return nil, 0, err
	}
	cpu := cpuTime() - cpu0
	var rep churnReport
	if err := json.Unmarshal([]byte(l), &rep); err != nil {
		return nil, 0, fmt.Errorf("the workloads' report %q: %w", l, err)
	}
	return &rep, cpu, nil
}

// churnWatcher is one Get stream's record: when each address was first
// added and then removed.
type churnWatcher struct {
	service int
	mu      sync.Mutex
	added   map[netip.AddrPort]time.Time
	removed map[netip.AddrPort]time.Time
}

// churnChild is the workloads' and watchers' process of
// registration_churn: it opens the watchers, says "ready" once each had
// its first answer, starts a workload every 1/rate s (Register, life
// after its acceptance Deregister), waits until every watcher saw every
// workload come and go (or 60 s after the last departure), and prints its
// report.
func churnChild() error {
	fs := flag.NewFlagSet("registration_churn", flag.ContinueOnError)
	addr := fs.String("addr", "", "control plane")
	var cfg churnConfig
	fs.IntVar(&cfg.workloads, "workloads", 0, "workloads")
	fs.IntVar(&cfg.services, "services", 0, "Services")
	fs.IntVar(&cfg.watchers, "watchers", 0, "Get streams")
	fs.IntVar(&cfg.rate, "rate", 0, "registrations a second")
	fs.DurationVar(&cfg.life, "life", 0, "time registered")
	if err := fs.Parse(os.Args[1:]); err != nil {
		return err
	}
	if cfg.workloads <= 0 || cfg.services <= 0 || cfg.watchers < cfg.services || cfg.rate <= 0 {
		return fmt.Errorf("registration_churn: bad sizes %+v", cfg)
	}
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()

	// The watchers, on 4 connections.
	const watchConns = 4
	dst := make([]pb.DestinationClient, watchConns)
	for i := range dst {
		cc, err := grpc.NewClient(*addr, grpc.WithTransportCredentials(insecure.NewCredentials()))
		if err != nil {
			return err
		}
		defer cc.Close()
		dst[i] = pb.NewDestinationClient(cc)
	}
	watchers := make([]*churnWatcher, cfg.watchers)
	var ready sync.WaitGroup
	var mu sync.Mutex
	var failed error
	for j := range watchers {
		w := &churnWatcher{service: j % cfg.services, added: map[netip.AddrPort]time.Time{}, removed: map[netip.AddrPort]time.Time{}}
		watchers[j] = w
		ready.Add(1)
		go func() {
			st, err := dst[j%watchConns].Get(ctx, &pb.GetDestination{Path: churnName(w.service)})
			first := true
			for err == nil {
				var u *pb.Update
				if u, err = st.Recv(); err != nil {
					break
				}
				now := time.Now()
				if first {
					first = false
					ready.Done()
					continue
				}
				w.mu.Lock()
				for _, a := range u.GetAdd().GetAddrs() {
					if ap, ok := churnAddrOf(a.GetAddr()); ok {
						if _, seen := w.added[ap]; !seen {
							w.added[ap] = now
						}
					}
				}
				for _, a := range u.GetRemove().GetAddrs() {
					if ap, ok := churnAddrOf(a); ok {
						if _, seen := w.removed[ap]; !seen {
							w.removed[ap] = now
						}
					}
				}
				w.mu.Unlock()
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

	// The workloads, on 8 connections, as 8 processes' worth of
	// registration clients.
	const regConns = 8
	conns := make([]*grpc.ClientConn, regConns)
	for i := range conns {
		cc, err := registration.Dial(*addr, nil, "")
		if err != nil {
			return err
		}
		defer cc.Close()
		conns[i] = cc
	}
	fmt.Println("ready")

	regStart := make([]time.Time, cfg.workloads)
	depStart := make([]time.Time, cfg.workloads)
	accepted := make([]time.Duration, cfg.workloads)
	var wg sync.WaitGroup
	var registered, deregistered int
	start := time.Now()
	interval := time.Second / time.Duration(cfg.rate)
	for i := range cfg.workloads {
		if d := time.Until(start.Add(time.Duration(i) * interval)); d > 0 {
			time.Sleep(d)
		}
		wg.Add(1)
		go func() {
			defer wg.Done()
			eps := []registration.Endpoint{{Authority: churnName(i % cfg.services), Addr: churnAddr(i), H2: true}}
			t0 := time.Now()
			reg, err := registration.Register(ctx, conns[i%regConns], eps, registration.WithLogger(quiet))
			if err != nil {
				mu.Lock()
				failed = errors.Join(failed, err)
				mu.Unlock()
				return
			}
			select {
			case <-reg.Accepted():
			case <-time.After(time.Minute):
				mu.Lock()
				failed = errors.Join(failed, fmt.Errorf("workload %d not accepted in a minute: %v", i, reg.Err()))
				mu.Unlock()
				_ = reg.Deregister(ctx)
				return
			}
			t1 := time.Now()
			// Its life: how long it stays registered before it leaves.
			time.Sleep(cfg.life)
			t2 := time.Now()
			dctx, dcancel := context.WithTimeout(ctx, time.Minute)
			err = reg.Deregister(dctx)
			dcancel()
			mu.Lock()
			defer mu.Unlock()
			regStart[i], accepted[i], depStart[i] = t0, t1.Sub(t0), t2
			registered++
			if err != nil {
				failed = errors.Join(failed, fmt.Errorf("workload %d: %w", i, err))
				return
			}
			deregistered++
		}()
	}
	wg.Wait()
	if failed != nil {
		return failed
	}

	// Every watcher has seen every workload of its Service come and go,
	// or the deadline passed (what is missing is reported as lost).
	complete := func() bool {
		for _, w := range watchers {
			w.mu.Lock()
			n := len(w.removed)
			w.mu.Unlock()
			want := cfg.workloads / cfg.services
			if w.service < cfg.workloads%cfg.services {
				want++
			}
			if n < want {
				return false
			}
		}
		return true
	}
	deadline := time.Now().Add(time.Minute)
	for !complete() && time.Now().Before(deadline) {
		time.Sleep(10 * time.Millisecond)
	}
	rep := churnReport{Registered: registered, Deregistered: deregistered}
	var adds, removes []float64
	var last time.Time
	for _, w := range watchers {
		w.mu.Lock()
		for i := w.service; i < cfg.workloads; i += cfg.services {
			rep.Expected++
			a := churnAddr(i)
			if t, ok := w.added[a]; ok {
				adds = append(adds, float64(t.Sub(regStart[i])))
			}
			if t, ok := w.removed[a]; ok {
				removes = append(removes, float64(t.Sub(depStart[i])))
				if t.After(last) {
					last = t
				}
			}
		}
		w.mu.Unlock()
	}
	rep.Adds, rep.Removes = len(adds), len(removes)
	rep.AddP50, rep.AddP99, rep.AddMax = quantiles(adds)
	rep.RemoveP50, rep.RemoveP99, rep.RemoveMax = quantiles(removes)
	acc := make([]float64, len(accepted))
	for i, d := range accepted {
		acc[i] = float64(d)
	}
	_, rep.AcceptP99, _ = quantiles(acc)
	rep.Seconds = last.Sub(start).Seconds()
	return json.NewEncoder(os.Stdout).Encode(rep)
}

// churnAddrOf reads a watcher's address as a workload's (10.0.0.0/8);
// the Services' own endpoints are not.
func churnAddrOf(a *pb.TcpAddress) (netip.AddrPort, bool) {
	ip := a.GetIp().GetIpv4()
	if ip>>24 != 10 {
		return netip.AddrPort{}, false
	}
	return netip.AddrPortFrom(netip.AddrFrom4([4]byte{byte(ip >> 24), byte(ip >> 16), byte(ip >> 8), byte(ip)}), uint16(a.GetPort())), true
}

// quantiles returns the p50, p99 and max of v (zeros when empty).
func quantiles(v []float64) (p50, p99, maxV float64) {
	if len(v) == 0 {
		return 0, 0, 0
	}
	slices.Sort(v)
	at := func(q float64) float64 { return v[min(len(v)-1, int(q*float64(len(v))))] }
	return at(0.50), at(0.99), v[len(v)-1]
}
