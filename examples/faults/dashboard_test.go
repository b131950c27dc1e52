package faults

import (
	"bufio"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net"
	"net/http"
	"runtime"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/inmesh/inmesh/dashboard"
	inmesh "github.com/inmesh/inmesh/mesh"
	"github.com/inmesh/inmesh/tap"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"go.opentelemetry.io/otel/metric/noop"
)

// samples keeps the first few of a kind of failure.
type samples struct {
	mu   sync.Mutex
	list []string
}

func (s *samples) add(x string) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if len(s.list) < 5 {
		s.list = append(s.list, x)
	}
}

func (s *samples) get() []string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return slices.Clone(s.list)
}

// nonLoopback returns an IPv4 address of this machine that is not
// loopback, "" when there is none.
func nonLoopback() string {
	addrs, err := net.InterfaceAddrs()
	if err != nil {
		return ""
	}
	for _, a := range addrs {
		if n, ok := a.(*net.IPNet); ok && n.IP.To4() != nil && !n.IP.IsLoopback() && n.IP.IsGlobalUnicast() {
			return n.IP.String()
		}
	}
	return ""
}

// A dashboard read by many at once while traffic flows through the stacks
// it shows: 32 readers fetch state.json (and the page now and then) without
// pause and 4 more open the tap, read a few events and leave, while 4
// workers send requests through a tapped outbound stack to a tapped
// inbound one. No request and no read fails; the route table counts every
// request once on each side; the process's goroutines stay bounded while
// it lasts and return to their baseline after. A client that is not on
// loopback (this machine's own non-loopback address, dialled from it) gets
// 403 for the page, state.json and the tap, from the same dashboard that
// answers loopback; without such an address, a dashboard whose access
// rule (WithAccess) admits no one shows the refusal instead.
func TestDashboardUnderLoad(t *testing.T) {
	hub := tap.NewHub()
	app := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) { io.WriteString(w, "ok") })
	srv := inmesh.NewServer(app, inmesh.WithTap(hub), inmesh.WithMeterProvider(noop.NewMeterProvider()), inmesh.WithLogger(quiet))
	t.Cleanup(srv.Close)
	client := meshClient(t, books, serveInbound(t, srv), "", inmesh.WithTap(hub))
	hc := &http.Client{Transport: client, Timeout: 10 * time.Second}
	d := dashboard.New(hub, dashboard.WithBalancer(client.Balancer()), dashboard.WithName("faults"))
	t.Cleanup(d.Close)
	addr := serveHTTP(t, d, nil)
	readers := &http.Client{Transport: &http.Transport{MaxIdleConnsPerHost: 64}, Timeout: 10 * time.Second}
	defer readers.CloseIdleConnections()

	var sent, failed atomic.Int64
	var failures samples
	request := func() {
		sent.Add(1)
		code, err := get(context.Background(), hc, books, books, "/books/1")
		if err != nil || code != 200 {
			failed.Add(1)
			failures.add(fmt.Sprint(code, err))
		}
	}
	var reads, readFailed atomic.Int64
	var readFailures samples
	read := func(ctx context.Context, path string, check func(*http.Response) error) {
		reads.Add(1)
		req, err := http.NewRequestWithContext(ctx, "GET", "http://"+addr+path, nil)
		require.NoError(t, err)
		resp, err := readers.Do(req)
		if err == nil {
			if resp.StatusCode != 200 {
				err = fmt.Errorf("%s: status %d", path, resp.StatusCode)
			} else {
				err = check(resp)
			}
			_, _ = io.Copy(io.Discard, resp.Body)
			resp.Body.Close()
		}
		if err != nil && ctx.Err() == nil {
			readFailed.Add(1)
			readFailures.add(err.Error())
		}
	}
	state := func(resp *http.Response) error {
		var s dashboard.State
		return json.NewDecoder(resp.Body).Decode(&s)
	}
	page := func(resp *http.Response) error {
		b, err := io.ReadAll(resp.Body)
		if err == nil && !strings.Contains(string(b), "<html") {
			err = fmt.Errorf("the page is not HTML: %.80q", b)
		}
		return err
	}
	tapRead := func(resp *http.Response) error {
		s := bufio.NewScanner(resp.Body)
		for i := 0; i < 5; i++ {
			if !s.Scan() {
				return fmt.Errorf("the tap ended after %d lines: %v", i, s.Err())
			}
			var e tap.Event
			if err := json.Unmarshal(s.Bytes(), &e); err != nil {
				return err
			}
		}
		return nil
	}

	// Warm up every path, then the baseline.
	for range 50 {
		request()
	}
	bg := context.Background()
	read(bg, "/state.json", state)
	read(bg, "/", page)
	base := measure()
	t.Logf("baseline: %v", base)

	dur := time.Duration(size(30, 3)) * time.Second
	ctx, stop := context.WithTimeout(context.Background(), dur)
	defer stop()
	var wg sync.WaitGroup
	loop := func(n int, f func(i int)) {
		for range n {
			wg.Add(1)
			go func() {
				defer wg.Done()
				for i := 0; ctx.Err() == nil; i++ {
					f(i)
				}
			}()
		}
	}
	loop(4, func(int) { request() })
	loop(32, func(i int) {
		if i%10 == 9 {
			read(bg, "/", page)
		} else {
			read(bg, "/state.json", state)
		}
	})
	// A tap reader waits for five events: it is cut short when the
	// traffic ends.
	loop(4, func(int) { read(ctx, "/tap", tapRead) })
	peak := 0
	for ctx.Err() == nil {
		peak = max(peak, runtime.NumGoroutine())
		time.Sleep(50 * time.Millisecond) // a sampling period, not a wait for anything
	}
	wg.Wait()
	t.Logf("%v: %d requests (%d failed), %d dashboard reads (%d failed); peak %d goroutines",
		dur, sent.Load(), failed.Load(), reads.Load(), readFailed.Load(), peak)
	assert.Zero(t, failed.Load(), "requests failed, e.g. %v", failures.get())
	assert.Zero(t, readFailed.Load(), "dashboard reads failed, e.g. %v", readFailures.get())
	assert.LessOrEqual(t, peak, base.goroutines+400, "goroutines while 36 readers and 4 workers run")

	// Every request is in the route table once on each side.
	s := d.State()
	var in, out uint64
	for _, r := range s.Routes {
		switch r.Direction {
		case "inbound":
			in += r.Requests
		case "outbound":
			out += r.Requests
		}
	}
	assert.Equal(t, uint64(sent.Load()), in, "inbound requests in the route table")
	assert.Equal(t, uint64(sent.Load()), out, "outbound requests in the route table")
	require.NotEmpty(t, s.Endpoints, "the balancer's endpoints")
	assert.Equal(t, books, s.Endpoints[0].Authority)

	readers.CloseIdleConnections()
	hc.CloseIdleConnections()
	backToBaseline(t, base, 10, 16, nil)

	// Access from a client that is not on loopback.
	refused := func(t *testing.T, addr string, dial func(ctx context.Context, network, addr string) (net.Conn, error)) {
		c := &http.Client{Transport: &http.Transport{DialContext: dial, DisableKeepAlives: true}, Timeout: 10 * time.Second}
		for _, path := range []string{"/", "/state.json", "/tap"} {
			resp, err := c.Get("http://" + addr + path)
			require.NoError(t, err)
			b, _ := io.ReadAll(resp.Body)
			resp.Body.Close()
			assert.Equal(t, http.StatusForbidden, resp.StatusCode, "%s: %s", path, b)
			assert.NotContains(t, string(b), books, "%s: the refusal shows nothing", path)
		}
	}
	if ip := nonLoopback(); ip != "" {
		lis, err := net.Listen("tcp", net.JoinHostPort(ip, "0"))
		require.NoError(t, err)
		remote := &http.Server{Handler: d, ReadHeaderTimeout: 10 * time.Second}
		go remote.Serve(lis)
		t.Cleanup(func() { remote.Close() })
		from := &net.Dialer{LocalAddr: &net.TCPAddr{IP: net.ParseIP(ip)}, Timeout: 5 * time.Second}
		t.Logf("a client at %s, not loopback", ip)
		refused(t, lis.Addr().String(), from.DialContext)
		// The same dashboard answers loopback.
		read(bg, "/state.json", state)
		assert.Zero(t, readFailed.Load(), "loopback refused, e.g. %v", readFailures.get())
	} else {
		t.Log("no non-loopback address on this machine: a dashboard whose access rule admits no one")
		none := dashboard.New(hub, dashboard.WithAccess(func(*http.Request) bool { return false }))
		t.Cleanup(none.Close)
		refused(t, serveHTTP(t, none, nil), (&net.Dialer{Timeout: 5 * time.Second}).DialContext)
	}
}
