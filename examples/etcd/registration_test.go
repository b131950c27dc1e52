package etcd_test

import (
	"context"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"net/netip"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/inmesh/inmesh/examples/internal/etcdtest"
	pb "github.com/inmesh/inmesh/proxyapi/destinationpb"
	"github.com/inmesh/inmesh/registration"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/status"
)

const (
	regBooks   = "books.default.svc.cluster.local:7000"
	regBooksID = "books.default.serviceaccount.identity.linkerd.cluster.local"
	regWebID   = "web.default.serviceaccount.identity.linkerd.cluster.local"
	// regManifests bind books:7000 to the books service account.
	regManifests = `apiVersion: v1
kind: Service
metadata: {name: books, namespace: default}
spec: {selector: {app: books}, ports: [{name: http, port: 7000}]}
---
apiVersion: v1
kind: Pod
metadata: {name: books-0, namespace: default, labels: {app: books}}
spec: {serviceAccountName: books, containers: [{name: app}]}
`
	regTokens = `- {token: books-secret, serviceAccount: books, namespace: default}
- {token: web-secret, serviceAccount: web, namespace: default}
`
)

var idAddrRe = regexp.MustCompile(`msg="serving the Identity API" addr=(\S+)`)

// fleetTTL is the registration TTL of the replicas of startFleet.
const fleetTTL = 5 * time.Second

// fleet is two examples/destination replicas over one etcd with one trust
// root, serving the Identity and Registration APIs over mTLS.
type fleet struct {
	bin                  string
	dir                  string // the identity dir and the token files
	dst, id              [2]string
	replicas             [2]*proc
	tokenFiles           map[string]string
	anchors, etcdAddress string
}

func startFleet(t *testing.T) *fleet {
	t.Helper()
	f := &fleet{bin: buildExamples(t), dir: t.TempDir(), tokenFiles: map[string]string{}}
	m := etcdtest.Start(t)
	f.etcdAddress = m.Endpoint
	write := func(name, data string) string {
		p := filepath.Join(f.dir, name)
		require.NoError(t, os.WriteFile(p, []byte(data), 0o600))
		return p
	}
	tokens := write("tokens.yaml", regTokens)
	f.tokenFiles[regBooksID] = write("books.token", "books-secret")
	f.tokenFiles[regWebID] = write("web.token", "web-secret")
	manifests := write("books.yaml", regManifests)
	out, err := exec.Command(filepath.Join(f.bin, "destination"), "apply", "-etcd-endpoints", m.Endpoint, "-f", manifests).CombinedOutput()
	require.NoError(t, err, "%s", out)
	idDir := filepath.Join(f.dir, "identity")
	require.NoError(t, os.Mkdir(idDir, 0o700))
	f.anchors = filepath.Join(idDir, "ca.crt")
	// One replica after the other: the first makes the trust root, the
	// second reads it. The leases run a short TTL, so that the tests of
	// their expiry are short (TestLiveRegistrationMovesOffAFrozenReplica
	// runs the default).
	for i := range f.replicas {
		f.replicas[i] = startProc(t, filepath.Join(f.bin, "destination"), "-listen", "127.0.0.1:0", "-etcd-endpoints", m.Endpoint,
			"-identity-dir", idDir, "-identity-tokens", tokens, "-identity-listen", "127.0.0.1:0", "-registration-ttl", fleetTTL.String())
		f.dst[i], f.id[i] = f.replicas[i].waitLog(t, dstAddrRe), f.replicas[i].waitLog(t, idAddrRe)
	}
	return f
}

// proxy starts examples/proxy with identity id, its control plane on
// replica, and args.
func (f *fleet) proxy(t *testing.T, id string, replica int, args ...string) *proc {
	t.Helper()
	return startProc(t, filepath.Join(f.bin, "proxy"), append([]string{"-destination", f.dst[replica],
		"-outbound", "127.0.0.1:0", "-inbound", "127.0.0.1:0", "-metrics", "127.0.0.1:0",
		"-identity-name", id, "-identity-token-file", f.tokenFiles[id], "-identity-trust-anchors", f.anchors,
		"-identity-addr", f.id[replica]}, args...)...)
}

// watchEndpoints follows the endpoints of books:7000 on a replica's
// Destination API; the returned function gives the set's size.
func watchEndpoints(t *testing.T, addr string) func() int {
	t.Helper()
	conn, err := grpc.NewClient(addr, grpc.WithTransportCredentials(insecure.NewCredentials()))
	require.NoError(t, err)
	ctx, cancel := context.WithCancel(context.Background())
	st, err := pb.NewDestinationClient(conn).Get(ctx, &pb.GetDestination{Path: regBooks})
	require.NoError(t, err)
	var mu sync.Mutex
	set := map[string]bool{}
	done := make(chan struct{})
	go func() {
		defer close(done)
		for {
			up, err := st.Recv()
			if err != nil {
				return
			}
			mu.Lock()
			for _, a := range up.GetAdd().GetAddrs() {
				set[fmt.Sprint(a.GetAddr().GetIp(), a.GetAddr().GetPort())] = true
			}
			for _, a := range up.GetRemove().GetAddrs() {
				delete(set, fmt.Sprint(a.GetIp(), a.GetPort()))
			}
			mu.Unlock()
		}
	}()
	t.Cleanup(func() {
		cancel()
		<-done
		conn.Close()
	})
	return func() int {
		mu.Lock()
		defer mu.Unlock()
		return len(set)
	}
}

func namedHTTP(t *testing.T, name string) string {
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) { io.WriteString(w, name) }))
	t.Cleanup(srv.Close)
	return strings.TrimPrefix(srv.URL, "http://")
}

func waitProcReady(t *testing.T, p *proc) {
	t.Helper()
	waitReady(t, p.waitLog(t, listenRe("metrics")))
}

// Two examples/proxy register themselves as books:7000 through replica 0
// (over mTLS, as books' identity, bound by the Service's selector and the
// Pod's service account); a caller's proxy on replica 1 reaches them by
// name on its first request. One is killed (SIGKILL): it is gone from both
// replicas' answers within the registration TTL (fleetTTL). The other is stopped
// (SIGTERM) while the caller sends requests without pause: it deregisters
// before its listener closes, and the caller sees no failed request. Last,
// the replica that holds the third's registration is killed, then the
// third: the other replica drops it when its lease expires, within the TTL.
func TestRegisteredProxies(t *testing.T) {
	if _, err := exec.LookPath("curl"); err != nil {
		if os.Getenv("CI") != "" {
			t.Fatal("curl is not installed")
		}
		t.Skip("curl is not installed")
	}
	f := startFleet(t)
	sizes := [2]func() int{watchEndpoints(t, f.dst[0]), watchEndpoints(t, f.dst[1])}

	a := f.proxy(t, regBooksID, 0, "-app", namedHTTP(t, "a"), "-register", regBooks, "-register-label", "zone=zone-a")
	a.waitLog(t, listenRe("inbound"))
	caller := f.proxy(t, regWebID, 1)
	callerOut := caller.waitLog(t, listenRe("outbound"))
	waitProcReady(t, caller)
	for i, size := range sizes {
		require.Eventually(t, func() bool { return size() == 1 }, timeout, 10*time.Millisecond, "replica %d serves the registration", i)
	}
	// The first request, on a fresh caller.
	got, err := exec.Command("curl", "-sS", "--max-time", "10", "-H", "Host: "+regBooks, "http://"+callerOut+"/").CombinedOutput()
	require.NoError(t, err, "%s", got)
	require.Equal(t, "a", string(got))

	b := f.proxy(t, regBooksID, 0, "-app", namedHTTP(t, "b"), "-register", regBooks)
	b.waitLog(t, listenRe("inbound"))
	for i, size := range sizes {
		require.Eventually(t, func() bool { return size() == 2 }, timeout, 10*time.Millisecond, "replica %d serves both", i)
	}

	// SIGKILL: gone from every replica within the TTL.
	killed := time.Now()
	require.NoError(t, a.cmd.Process.Signal(syscall.SIGKILL))
	for i, size := range sizes {
		require.Eventually(t, func() bool { return size() == 1 }, 10*time.Second, 10*time.Millisecond, "replica %d drops the killed workload", i)
	}
	gone := time.Since(killed)
	t.Logf("killed workload gone from both replicas after %v", gone.Round(time.Millisecond))
	assert.Less(t, gone, fleetTTL, "within the registration TTL")

	// A graceful stop under load.
	c := f.proxy(t, regBooksID, 0, "-app", namedHTTP(t, "c"), "-register", regBooks)
	c.waitLog(t, listenRe("inbound"))
	for i, size := range sizes {
		require.Eventually(t, func() bool { return size() == 2 }, timeout, 10*time.Millisecond, "replica %d serves b and c", i)
	}
	var sent, failed atomic.Int64
	var servedB, servedC atomic.Int64
	ctx, stop := context.WithCancel(context.Background())
	var wg sync.WaitGroup
	for range 4 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			client := &http.Client{Timeout: 10 * time.Second}
			for ctx.Err() == nil {
				req, _ := http.NewRequest("GET", "http://"+callerOut+"/", nil)
				req.Host = regBooks
				sent.Add(1)
				resp, err := client.Do(req)
				if err != nil {
					failed.Add(1)
					t.Logf("failed: %v", err)
					continue
				}
				body, _ := io.ReadAll(resp.Body)
				resp.Body.Close()
				switch {
				case resp.StatusCode != 200:
					failed.Add(1)
					t.Logf("failed: %d %s", resp.StatusCode, body)
				case string(body) == "b":
					servedB.Add(1)
				case string(body) == "c":
					servedC.Add(1)
				}
			}
		}()
	}
	require.Eventually(t, func() bool { return servedB.Load() > 0 && servedC.Load() > 0 }, timeout, 10*time.Millisecond, "both serve")
	require.NoError(t, b.cmd.Process.Signal(syscall.SIGTERM))
	require.NoError(t, b.cmd.Wait())
	afterB := servedC.Load()
	require.Eventually(t, func() bool { return servedC.Load() > afterB+100 }, timeout, 10*time.Millisecond)
	stop()
	wg.Wait()
	t.Logf("%d requests, %d failed", sent.Load(), failed.Load())
	assert.Zero(t, failed.Load(), "failed requests at the caller")
	for i, size := range sizes {
		assert.Equal(t, 1, size(), "replica %d after b's exit", i)
	}

	// The replica that holds c's registration dies, then c: no replica
	// sees c's stream end, and c's lease expires within the TTL.
	require.NoError(t, f.replicas[0].cmd.Process.Signal(syscall.SIGKILL))
	dead := time.Now()
	require.NoError(t, c.cmd.Process.Signal(syscall.SIGKILL))
	require.Eventually(t, func() bool { return sizes[1]() == 0 }, timeout, 10*time.Millisecond, "replica 1 drops c when its lease expires")
	expired := time.Since(dead)
	t.Logf("c gone from replica 1 %v after its replica died", expired.Round(time.Millisecond))
	assert.Less(t, expired, fleetTTL+2*time.Second, "within the registration TTL and etcd's lease check")
}

// examples/destination over files refuses a plaintext registrant; with
// -insecure-registration it says so loudly at start and accepts one, whose
// endpoint then reaches the Destination API's answers (held in memory, with
// no endpoints file).
func TestInsecureRegistrationFlag(t *testing.T) {
	bin := buildExamples(t)
	policies := t.TempDir()
	require.NoError(t, os.WriteFile(filepath.Join(policies, "books.yaml"), []byte(regManifests), 0o644))
	register := func(addr string) *registration.Registration {
		conn, err := registration.Dial(addr, nil, "")
		require.NoError(t, err)
		t.Cleanup(func() { conn.Close() })
		r, err := registration.Register(context.Background(), conn, []registration.Endpoint{{
			Authority: regBooks, Addr: netip.MustParseAddrPort("127.0.0.1:4001"), H2: true}},
			registration.WithLogger(slog.New(slog.DiscardHandler)))
		require.NoError(t, err)
		t.Cleanup(func() {
			ctx, cancel := context.WithTimeout(context.Background(), timeout)
			defer cancel()
			_ = r.Deregister(ctx)
		})
		return r
	}

	secure := startProc(t, filepath.Join(bin, "destination"), "-listen", "127.0.0.1:0", "-policies", policies)
	r := register(secure.waitLog(t, dstAddrRe))
	require.Eventually(t, func() bool { return status.Code(r.Err()) == codes.PermissionDenied }, timeout, 10*time.Millisecond)
	assert.Contains(t, r.Err().Error(), "no verified mTLS identity")

	dev := startProc(t, filepath.Join(bin, "destination"), "-listen", "127.0.0.1:0", "-policies", policies, "-insecure-registration")
	addr := dev.waitLog(t, dstAddrRe)
	dev.waitLog(t, regexp.MustCompile(`level=WARN msg="controlplane: INSECURE REGISTRATION`))
	size := watchEndpoints(t, addr)
	r = register(addr)
	select {
	case <-r.Accepted():
	case <-time.After(timeout):
		t.Fatalf("not accepted: %v", r.Err())
	}
	require.Eventually(t, func() bool { return size() == 1 }, timeout, 10*time.Millisecond)
}
