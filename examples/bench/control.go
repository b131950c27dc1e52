package main

import (
	"context"
	"fmt"
	"net"
	"net/http"
	"net/http/httptest"
	"os"
	"runtime"
	"runtime/debug"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/inmesh/inmesh/profiles"
	"github.com/inmesh/inmesh/router"
)

// during runs m while every runs each period, and reports how many times
// it ran.
func during(period time.Duration, every func(i int), m func() (figures, error)) (figures, int, error) {
	stop := make(chan struct{})
	var wg sync.WaitGroup
	var count atomic.Int64
	wg.Add(1)
	go func() {
		defer wg.Done()
		t := time.NewTicker(period)
		defer t.Stop()
		for i := 0; ; i++ {
			select {
			case <-stop:
				return
			case <-t.C:
				every(i)
				count.Add(1)
			}
		}
	}()
	f, err := m()
	close(stop)
	wg.Wait()
	return f, int(count.Load()), err
}

// profileSwap: the whole mesh with 64 clients while the control plane
// changes books' profile 100 times a second, against the same without
// changes.
func profileSwap(o options) (*result, error) {
	mp := newMeter()
	defer mp.Shutdown(context.Background())
	m, err := newMeshed(ok, mp)
	if err != nil {
		return nil, err
	}
	defer m.close()
	n := o.scale(10000, 5000)
	load := func() (figures, error) {
		return parallel(m.st.client, func() *http.Request { return get("http://"+books+"/books/1", "") }, n, 64, false)
	}
	var updates, elapsed float64
	swapping := func() (figures, error) {
		t0 := time.Now()
		f, c, err := during(10*time.Millisecond, func(i int) { m.cp.putProfile(strconv.Itoa(i % 2)) }, load)
		updates += float64(c)
		elapsed += time.Since(t0).Seconds()
		return f, err
	}
	rs, err := interleave(o.rounds, variant{"steady", load}, variant{"swapping", swapping})
	if err != nil {
		return nil, err
	}
	r := &result{
		ratio:     rs.ratio("", atLeast(0.97), func(f []figures) float64 { return f[1].RPS / f[0].RPS }),
		Candidate: rs.median(1), Baseline: rs.median(0),
	}
	cpu, err := cpuPerUpdate(m, o.scale(200, 50))
	if err != nil {
		return nil, err
	}
	routerCPU, err := routerCPUPerUpdate(o.scale(5000, 500))
	if err != nil {
		return nil, err
	}
	r.Extra = append(r.Extra, ratio{Name: "router CPU µs per profile update (20 routes, one router, then a request)",
		Ratio: routerCPU, Goal: atMost(100), Spread: spread{routerCPU, routerCPU}})
	// The whole process: most of it is gRPC and protobuf. One router's
	// share is BenchmarkProfileUpdate in package router/internal/profileroute.
	r.Extra = append(r.Extra, ratio{Name: "process CPU µs per profile update (20 routes; control plane, gRPC, outbound and inbound router)",
		Ratio: cpu, Goal: noGoal, Spread: spread{cpu, cpu}})
	r.Note = fmt.Sprintf("ratio = requests/s while the profile changes / steady; %.0f profile updates/s delivered (20 routes each)", updates/elapsed)
	return r, nil
}

// cpuPerUpdate returns the process CPU time, in microseconds, of one
// profile update with no traffic: the control plane's encoding and
// sending, the client's decoding, and both routers' compiling, each
// update waited for until both routers hold it.
func cpuPerUpdate(m *meshed, n int) (float64, error) {
	routers := []*router.Router{m.st.client.Router(), m.st.server.Router()}
	return cpuPer(n, func(i int) func() bool {
		tag := "cpu" + strconv.Itoa(i%2)
		m.cp.putProfile(tag)
		return func() bool {
			for _, r := range routers {
				t := r.ProfileTable(books)
				if t == nil || len(t.Routes()) == 0 || !strings.HasSuffix(t.Routes()[0].Labels["route"], " "+tag) {
					return false
				}
			}
			return true
		}
	})
}

// routerCPUPerUpdate returns the CPU time, in microseconds, one inbound
// router spends on a profile update of 20 routes: two profiles that differ
// in their route names delivered in turn by a static source, each waited
// for, then one request on the new table (whose first request builds the
// route's metric targets).
func routerCPUPerUpdate(n int) (float64, error) {
	mp := newMeter()
	defer mp.Shutdown(context.Background())
	src, _ := staticProfiles()
	st := src.(*profiles.StaticSource)
	versions := [2]*profiles.Profile{
		serviceProfile(strings.Split(books, ":")[0], "a").ProfileFor(7000),
		serviceProfile(strings.Split(books, ":")[0], "b").ProfileFor(7000),
	}
	rtr := router.New(router.WithProfiles(src), router.WithMeterProvider(mp), router.WithLogger(quiet), router.WithLocalAuthorities(books))
	defer rtr.Close()
	h := rtr.Handler(ok)
	req := httptest.NewRequest("GET", "http://"+books+"/books/1", nil)
	h.ServeHTTP(httptest.NewRecorder(), req) // the watch starts
	w := httptest.NewRecorder()
	return cpuPer(n, func(i int) func() bool {
		p := versions[i%2]
		st.Set(books, p)
		served := false
		return func() bool {
			if t := rtr.ProfileTable(books); t == nil || t.Profile() != p {
				return false
			}
			if !served {
				h.ServeHTTP(w, req)
				served = true
			}
			return true
		}
	})
}

// cpuPer returns the process CPU time, in microseconds, of each of n
// steps: step i starts its work and returns the check of its end, which
// is polled with sleeps, not spinning (a spinning wait would be most of
// the figure). The sleeps' own CPU is measured alone afterwards and taken
// off.
func cpuPer(n int, step func(i int) (done func() bool)) (float64, error) {
	const pause = 20 * time.Microsecond
	polls := 0
	before := cpuTime()
	for i := range n {
		deadline := time.Now().Add(10 * time.Second)
		for done := step(i); !done(); polls++ {
			if time.Now().After(deadline) {
				return 0, fmt.Errorf("update %d never arrived", i)
			}
			time.Sleep(pause)
		}
	}
	work := cpuTime() - before
	before = cpuTime()
	for range polls {
		time.Sleep(pause)
	}
	return float64(work-(cpuTime()-before)) / float64(n) / float64(time.Microsecond), nil
}

// cpuTime returns the user and system CPU time of this process.
func cpuTime() time.Duration {
	var ru syscall.Rusage
	if err := syscall.Getrusage(syscall.RUSAGE_SELF, &ru); err != nil {
		return 0
	}
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
}

// endpoints1000: p99 latency of 4 clients through the outbound stack to
// books, which has 1,000 endpoints, while the control plane sends a new
// weight for every one of them 20 times a second, against steady.
func endpoints1000(o options) (*result, error) {
	count := o.scale(1000, 200) // -short: 200, for a quick look and the test
	mp := newMeter()
	defer mp.Shutdown(context.Background())
	cp, err := newControlPlane()
	if err != nil {
		return nil, err
	}
	defer cp.close()
	cp.putProfile("")
	srv, guard := origprotoServer(downgrade(ok))
	var addrs []string
	var lis []net.Listener
	defer func() {
		srv.Close()
		for _, l := range lis {
			l.Close()
		}
	}()
	for range count {
		l, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			return nil, err
		}
		lis = append(lis, l)
		addrs = append(addrs, l.Addr().String())
		go srv.Serve(guard(l))
	}
	cp.putEndpoints(books, addrs, true, 10000)
	st := newStack(ok, mp, nil, cp.dst)
	defer st.close()
	req := func() *http.Request { return get("http://"+books+"/books/1", "") }
	if err := waitRoutes(st.client.Router(), books, func() { _ = do(st.client, req()) }); err != nil {
		return nil, err
	}
	n := o.scale(3000, 2000)
	load := func() (figures, error) { return parallel(st.client, req, n, 4, true) }
	// Touch the endpoints, so that connections exist before timing.
	if _, err := parallel(st.client, req, 3*count, 16, false); err != nil {
		return nil, err
	}
	updating := func() (figures, error) {
		f, _, err := during(50*time.Millisecond, func(i int) { cp.putEndpoints(books, addrs, true, uint32(10000+i%2)) }, load)
		return f, err
	}
	rs, err := interleave(o.rounds, variant{"steady", load}, variant{"updating", updating})
	if err != nil {
		return nil, err
	}
	r := &result{
		ratio:     rs.ratio("", noGoal, func(f []figures) float64 { return f[1].P99 / f[0].P99 }),
		Candidate: rs.median(1), Baseline: rs.median(0),
		Extra: []ratio{rs.ratio("p50 updating / steady", noGoal, func(f []figures) float64 { return f[1].P50 / f[0].P50 })},
	}
	r.Note = fmt.Sprintf("ratio = p99 while %d-endpoint updates arrive 20 times a second / steady (4 clients)", count)
	return r, nil
}

// hostFlood: memory growth of the outbound stack and its control plane
// (one process) over requests for distinct Hosts: IP literals on
// 127.0.0.0/8 whose port nothing listens on, so that each falls back to
// its own address and is refused at once.
func hostFlood(o options) (*result, error) {
	hosts := o.scale(100000, 10000)
	mp := newMeter()
	defer mp.Shutdown(context.Background())
	cp, err := newControlPlane()
	if err != nil {
		return nil, err
	}
	defer cp.close()
	st := newStack(ok, mp, nil, cp.dst)
	defer st.close()
	before, rssBefore := heap(), rss()
	var next atomic.Int64
	var wg sync.WaitGroup
	t0 := time.Now()
	// Bounded in time as well as in count, so that a slow stack cannot
	// hold the whole run.
	deadline := t0.Add(time.Duration(o.scale(60, 30)) * time.Second)
	for range 64 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for {
				i := next.Add(1) - 1
				if i >= int64(hosts) || time.Now().After(deadline) {
					return
				}
				host := fmt.Sprintf("127.%d.%d.%d:1", 1+i/65536, (i/256)%256, i%256)
				_ = do(st.client, get("http://"+host+"/", ""))
			}
		}()
	}
	wg.Wait()
	el := time.Since(t0)
	sent := min(int(next.Load())-64, hosts)
	after, rssAfter := heap(), rss()
	watches := cp.watches()
	growth := float64(after-before) / (1 << 20)
	r := &result{
		ratio:     ratio{Ratio: growth, Goal: atMost(30), Spread: spread{growth, growth}},
		Unit:      "MiB",
		Candidate: &figures{MiB: growth, Requests: float64(sent), RPS: float64(sent) / el.Seconds()},
		Baseline:  &figures{MiB: float64(before) / (1 << 20)},
		Rounds:    1,
	}
	r.Note = fmt.Sprintf("ratio = heap growth in MiB after %d distinct Hosts (after GC; RSS %+.0f MiB); %d watches open at the end",
		sent, float64(rssAfter-rssBefore)/(1<<20), watches)
	if sent < hosts {
		r.Note += fmt.Sprintf("; stopped at the time bound, %d of %d Hosts sent", sent, hosts)
	}
	return r, nil
}

// heap returns the live heap after a full collection.
func heap() uint64 {
	runtime.GC()
	debug.FreeOSMemory()
	var m runtime.MemStats
	runtime.ReadMemStats(&m)
	return m.HeapAlloc
}

// rss returns the resident set size of this process.
func rss() int64 {
	b, err := os.ReadFile("/proc/self/status")
	if err != nil {
		return 0
	}
	for _, line := range strings.Split(string(b), "\n") {
		if v, ok := strings.CutPrefix(line, "VmRSS:"); ok {
			kb, _ := strconv.ParseInt(strings.TrimSpace(strings.TrimSuffix(strings.TrimSpace(v), "kB")), 10, 64)
			return kb << 10
		}
	}
	return 0
}
