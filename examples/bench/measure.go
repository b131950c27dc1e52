package main

import (
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"runtime"
	"slices"
	"sync"
	"sync/atomic"
	"time"
)

// variant is one side of a comparison: measure runs it once and returns
// its figures.
type variant struct {
	name    string
	measure func() (figures, error)
}

// interleave runs every variant once per round, in an order that
// alternates between rounds so that neither side always goes first, and
// returns the figures by round and variant (in the order given).
func interleave(n int, vs ...variant) (rounds, error) {
	// One untimed pass of a tenth of the size warms connections, pools
	// and caches.
	warming.Store(true)
	for _, v := range vs {
		if _, err := v.measure(); err != nil {
			warming.Store(false)
			return nil, err
		}
	}
	warming.Store(false)
	rs := make(rounds, n)
	for r := range n {
		rs[r] = make([]figures, len(vs))
		for k := range vs {
			i := k
			if r%2 == 1 {
				i = len(vs) - 1 - k
			}
			runtime.GC()
			f, err := vs[i].measure()
			if err != nil {
				return nil, err
			}
			rs[r][i] = f
		}
	}
	return rs, nil
}

// warming is set during interleave's warm-up pass: the loops below run a
// tenth of their size.
var warming atomic.Bool

func sized(n int) int {
	if warming.Load() {
		return max(1, n/10)
	}
	return n
}

func mallocs() uint64 {
	var m runtime.MemStats
	runtime.ReadMemStats(&m)
	return m.Mallocs
}

// inProcess serves req n times through h into a recorder.
func inProcess(h http.Handler, req *http.Request, n int) figures {
	n = sized(n)
	a := mallocs()
	start := time.Now()
	for range n {
		h.ServeHTTP(httptest.NewRecorder(), req)
	}
	el := time.Since(start)
	return figures{NsPerOp: float64(el.Nanoseconds()) / float64(n), Allocs: float64(mallocs()-a) / float64(n)}
}

// do sends one request and drains the response.
func do(rt http.RoundTripper, req *http.Request) error {
	_, err := send(rt, req)
	return err
}

// send sends req, reads its response to the end and returns its status.
func send(rt http.RoundTripper, req *http.Request) (int, error) {
	resp, err := rt.RoundTrip(req)
	if err != nil {
		return 0, err
	}
	_, err = io.Copy(io.Discard, resp.Body)
	resp.Body.Close()
	return resp.StatusCode, err
}

// get returns a GET request for url with its Host set to host (the URL's
// own when empty).
func get(url, host string) *http.Request {
	req, err := http.NewRequest("GET", url, nil)
	if err != nil {
		panic(err)
	}
	if host != "" {
		req.Host = host
	}
	return req
}

// serial sends n requests one after the other and records each latency.
func serial(rt http.RoundTripper, req func() *http.Request, n int) (figures, error) {
	n = sized(n)
	lat := make([]time.Duration, n)
	a := mallocs()
	start := time.Now()
	for i := range n {
		t0 := time.Now()
		if err := do(rt, req()); err != nil {
			return figures{}, err
		}
		lat[i] = time.Since(t0)
	}
	el := time.Since(start)
	f := figures{NsPerOp: float64(el.Nanoseconds()) / float64(n), Allocs: float64(mallocs()-a) / float64(n)}
	f.P50, f.P99 = percentiles(lat)
	return f, nil
}

func percentiles(lat []time.Duration) (p50, p99 float64) {
	s := slices.Clone(lat)
	slices.Sort(s)
	at := func(q float64) float64 { return float64(s[min(len(s)-1, int(q*float64(len(s))))].Nanoseconds()) }
	return at(0.50), at(0.99)
}

// parallel sends total requests from workers goroutines and reports the
// throughput and, when lat is true, the latency percentiles.
func parallel(rt http.RoundTripper, req func() *http.Request, total, workers int, lat bool) (figures, error) {
	total = sized(total)
	var next atomic.Int64
	var firstErr atomic.Pointer[error]
	lats := make([][]time.Duration, workers)
	var wg sync.WaitGroup
	a := mallocs()
	start := time.Now()
	for w := range workers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for next.Add(1) <= int64(total) {
				t0 := time.Now()
				if err := do(rt, req()); err != nil {
					firstErr.CompareAndSwap(nil, &err)
					return
				}
				if lat {
					lats[w] = append(lats[w], time.Since(t0))
				}
			}
		}()
	}
	wg.Wait()
	el := time.Since(start)
	if e := firstErr.Load(); e != nil {
		return figures{}, *e
	}
	f := figures{RPS: float64(total) / el.Seconds(), Allocs: float64(mallocs()-a) / float64(total)}
	if lat {
		f.P50, f.P99 = percentiles(slices.Concat(lats...))
	}
	return f, nil
}

// server is an HTTP server on 127.0.0.1 that counts the connections it
// accepted.
type server struct {
	*httptest.Server
	conns atomic.Int64
}

// serve starts srv (its Handler set) on a new loopback listener, wrapped
// by each of wrap.
func serve(srv *http.Server, wrap ...func(net.Listener) net.Listener) *server {
	s := &server{Server: httptest.NewUnstartedServer(nil)}
	for _, w := range wrap {
		s.Listener = w(s.Listener)
	}
	s.Config = srv
	prev := srv.ConnState
	s.Config.ConnState = func(c net.Conn, st http.ConnState) {
		if st == http.StateNew {
			s.conns.Add(1)
		}
		if prev != nil {
			prev(c, st)
		}
	}
	s.Start()
	return s
}

func (s *server) addr() string { return s.Listener.Addr().String() }

// withConns runs m and adds the connections s accepted so far.
func withConns(s *server, m func() (figures, error)) func() (figures, error) {
	return func() (figures, error) {
		f, err := m()
		f.Connections = float64(s.conns.Load())
		return f, err
	}
}

// h1Transport is a plain HTTP/1 pool as a Go client would use.
func h1Transport() *http.Transport {
	t := &http.Transport{MaxIdleConnsPerHost: 64, Protocols: new(http.Protocols)}
	t.Protocols.SetHTTP1(true)
	return t
}

// h2cTransport is Go's own HTTP/2 prior-knowledge client.
func h2cTransport() *http.Transport {
	t := &http.Transport{Protocols: new(http.Protocols)}
	t.Protocols.SetUnencryptedHTTP2(true)
	return t
}

// ok is the application of every scenario: two bytes.
var ok = http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) { w.Write([]byte("ok")) })
