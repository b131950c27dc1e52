package mesh

import (
	"bufio"
	"context"
	"crypto/tls"
	"crypto/x509"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"regexp"
	"strings"
	"sync"
	"testing"

	"github.com/inmesh/inmesh/internal/testutil"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// The outbound stack labels a connection it dials with the address it
// dialled in one spelling: on the default route that address is its
// client's Host as the client spelled it, and one server reached under 50
// spellings of its address (leading zeros in the port, as net.Dial
// accepts) was 50 target_addr series in every tcp_* family, each as long
// as the client liked.
func TestTCPTargetAddrHasOneSpelling(t *testing.T) {
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) { io.WriteString(w, "ok") }))
	defer srv.Close()
	m := testutil.NewMetrics(t)
	client := NewClient(WithMeterProvider(m.Provider), WithLogger(quiet))
	defer client.Close()
	host, port, _ := strings.Cut(strings.TrimPrefix(srv.URL, "http://"), ":")
	hc := &http.Client{Transport: client, Timeout: testutil.Timeout}
	for i := 1; i <= 50; i++ {
		req, _ := http.NewRequest("GET", "http://"+host+":"+strings.Repeat("0", i)+port+"/", nil)
		resp, err := hc.Do(req)
		require.NoError(t, err)
		io.Copy(io.Discard, resp.Body)
		resp.Body.Close()
		require.Equal(t, 200, resp.StatusCode)
	}
	addrs := targetAddrs(t, m)
	longest := 0
	for a := range addrs {
		longest = max(longest, len(a))
	}
	assert.Len(t, addrs, 1, "one server, one target_addr; got %d values, the longest %d bytes", len(addrs), longest)
	assert.True(t, addrs[strings.TrimPrefix(srv.URL, "http://")], "target_addr is the server's address")
}

// connectProxy is an egress proxy on 127.0.0.1 that tunnels HTTP CONNECT.
func connectProxy(t *testing.T) string {
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	var wg sync.WaitGroup
	t.Cleanup(func() { lis.Close(); wg.Wait() })
	wg.Add(1)
	go func() {
		defer wg.Done()
		for {
			c, err := lis.Accept()
			if err != nil {
				return
			}
			wg.Add(1)
			go func() {
				defer wg.Done()
				defer c.Close()
				br := bufio.NewReader(c)
				req, err := http.ReadRequest(br)
				if err != nil {
					return
				}
				up, err := net.Dial("tcp", req.Host)
				if err != nil {
					return
				}
				defer up.Close()
				io.WriteString(c, "HTTP/1.1 200 OK\r\n\r\n")
				done := make(chan struct{})
				go func() { io.Copy(up, br); up.(*net.TCPConn).CloseWrite(); close(done) }()
				io.Copy(c, up)
				<-done
			}()
		}
	}()
	return lis.Addr().String()
}

// A stack that dials through a tunnel (WithDialContext) counts each
// connection under the address it dialled, not under the tunnel's, which
// its socket has (a version that labelled by the socket's address put
// every connection under the tunnel's).
func TestTCPTargetAddrThroughATunnel(t *testing.T) {
	proxy := connectProxy(t)
	tunnel := func(ctx context.Context, network, addr string) (net.Conn, error) {
		var d net.Dialer
		c, err := d.DialContext(ctx, "tcp", proxy)
		if err != nil {
			return nil, err
		}
		fmt.Fprintf(c, "CONNECT %s HTTP/1.1\r\nHost: %s\r\n\r\n", addr, addr)
		br := bufio.NewReader(c)
		resp, err := http.ReadResponse(br, nil)
		if err != nil || resp.StatusCode != 200 {
			c.Close()
			return nil, fmt.Errorf("tunnel: %v", err)
		}
		return c, nil
	}
	var srvs []string
	for range 2 {
		srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) { io.WriteString(w, "ok") }))
		defer srv.Close()
		srvs = append(srvs, strings.TrimPrefix(srv.URL, "http://"))
	}
	m := testutil.NewMetrics(t)
	client := NewClient(WithMeterProvider(m.Provider), WithLogger(quiet), WithDialContext(tunnel))
	defer client.Close()
	hc := &http.Client{Transport: client, Timeout: testutil.Timeout}
	for _, s := range srvs {
		resp, err := hc.Get("http://" + s + "/")
		require.NoError(t, err)
		io.Copy(io.Discard, resp.Body)
		resp.Body.Close()
		require.Equal(t, 200, resp.StatusCode)
	}
	addrs := targetAddrs(t, m)
	for _, s := range srvs {
		assert.True(t, addrs[s], "a series for server %s; got target_addr values %v (the tunnel is %s)", s, addrs, proxy)
	}
}

// noAddrConn is a connection whose transport knows no remote address (a
// tunnel over another protocol): net.Conn lets RemoteAddr return nil.
type noAddrConn struct{ net.Conn }

func (noAddrConn) RemoteAddr() net.Addr { return nil }

// A dial function may return a connection without a remote address: the
// stack counts it (a version that labelled by the socket's address
// crashed the process on it).
func TestTCPDialedConnWithoutRemoteAddr(t *testing.T) {
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) { io.WriteString(w, "ok") }))
	defer srv.Close()
	dial := func(ctx context.Context, network, addr string) (net.Conn, error) {
		var d net.Dialer
		c, err := d.DialContext(ctx, network, addr)
		if err != nil {
			return nil, err
		}
		return noAddrConn{c}, nil
	}
	client := NewClient(WithMeterProvider(testutil.NewMetrics(t).Provider), WithLogger(quiet), WithDialContext(dial))
	defer client.Close()
	resp, err := (&http.Client{Transport: client, Timeout: testutil.Timeout}).Get(srv.URL)
	require.NoError(t, err)
	resp.Body.Close()
}

// targetAddrs returns the target_addr values of tcp_open_total.
func targetAddrs(t *testing.T, m *testutil.Metrics) map[string]bool {
	re := regexp.MustCompile(`target_addr="([^"]*)"`)
	addrs := map[string]bool{}
	for _, l := range m.Lines(t, "tcp_open_total") {
		if sm := re.FindStringSubmatch(l); sm != nil {
			addrs[sm[1]] = true
		}
	}
	return addrs
}

// A connection whose meshed TLS handshake fails carried nothing: it is
// not counted, and not as plaintext (it was counted as tls="no_identity",
// no_tls_reason="no_tls_from_remote"), while a plaintext client's is.
func TestTCPFailedHandshakeNotCounted(t *testing.T) {
	p := newPKI(t)
	m := testutil.NewMetrics(t)
	server := NewServer(http.NotFoundHandler(), WithIdentity(p.certify(t, booksID)), WithMeterProvider(m.Provider), WithLogger(quiet))
	defer server.Close()
	addr := serveMeshed(t, server).String()

	// A TLS client that trusts nothing ends the handshake.
	conn, err := tls.Dial("tcp", addr, &tls.Config{ServerName: booksID, RootCAs: x509.NewCertPool()})
	require.Error(t, err)
	if conn != nil {
		conn.Close()
	}
	// A plaintext client's request, answered: its connection is counted.
	resp, err := (&http.Client{Timeout: testutil.Timeout}).Get("http://" + addr + "/")
	require.NoError(t, err)
	resp.Body.Close()

	lines := m.Lines(t, "tcp_open_total", `direction="inbound"`)
	require.Len(t, lines, 1, "%v", lines)
	assert.Contains(t, lines[0], `no_tls_reason="no_tls_from_remote"`)
	assert.True(t, strings.HasSuffix(lines[0], " 1"), "only the plaintext client's connection: %s", lines[0])
}
