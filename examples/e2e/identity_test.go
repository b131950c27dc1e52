package e2e

import (
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

const (
	webID   = "web.default.serviceaccount.identity.linkerd.cluster.local"
	booksID = "books.default.serviceaccount.identity.linkerd.cluster.local"
)

var identityAddrRe = regexp.MustCompile(`msg="serving the Identity API" addr=(\S+)`)

// startMeshedProxy starts a proxy with the identity name, certified by the
// embedded issuer at idAddr with the token in tokenFile.
func startMeshedProxy(t *testing.T, bin, dstAddr, appAddr, idAddr, anchors, name, tokenFile string) (p *proc, out, in, metrics string) {
	p = start(t, filepath.Join(bin, "proxy"), []string{"INMESH_CONTROL_BACKOFF_DELAY=100ms"},
		"-destination", dstAddr, "-outbound", "127.0.0.1:0", "-inbound", "127.0.0.1:0", "-app", appAddr, "-metrics", "127.0.0.1:0",
		"-identity-name", name, "-identity-token-file", tokenFile, "-identity-trust-anchors", anchors, "-identity-addr", idAddr)
	return p, p.waitLog(t, listenRe("outbound")), p.waitLog(t, listenRe("inbound")), p.waitLog(t, listenRe("metrics"))
}

func ready(addr string) int {
	resp, err := http.Get("http://" + addr + "/ready")
	if err != nil {
		return 0
	}
	resp.Body.Close()
	return resp.StatusCode
}

// The embedded control plane issues identities (a new trust anchor and
// issuer made in an empty directory); two proxies certified by it carry a
// request over mTLS, and the application behind the second sees the first
// one's identity in l5d-client-id. A proxy whose token proves another
// service account stays not ready.
func TestMeshedProxiesWithEmbeddedIssuer(t *testing.T) {
	bin := build(t)
	dir := t.TempDir()
	idDir := filepath.Join(dir, "identity")
	tokens := filepath.Join(dir, "tokens.yaml")
	require.NoError(t, os.WriteFile(tokens, []byte(`
- {token: web-token, serviceAccount: web, namespace: default}
- {token: books-token, serviceAccount: books, namespace: default}
`), 0o600))
	tokenFile := func(tok string) string {
		p := filepath.Join(dir, tok)
		require.NoError(t, os.WriteFile(p, []byte(tok), 0o600))
		return p
	}
	endpoints := filepath.Join(dir, "endpoints.yaml")
	require.NoError(t, os.WriteFile(endpoints, []byte("[]\n"), 0o644))
	var appRequests atomic.Int32
	app := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		appRequests.Add(1)
		fmt.Fprintf(w, "%s client=%s", r.Proto, r.Header.Get("L5d-Client-Id"))
	}))
	defer app.Close()
	appAddr := strings.TrimPrefix(app.URL, "http://")

	dst := start(t, filepath.Join(bin, "destination"), nil, "-listen", "127.0.0.1:0", "-endpoints", endpoints, "-interval", "100ms",
		"-identity-dir", idDir, "-identity-tokens", tokens, "-identity-listen", "127.0.0.1:0")
	dstAddr := dst.waitLog(t, dstAddrRe)
	idAddr := dst.waitLog(t, identityAddrRe)
	anchors := filepath.Join(idDir, "ca.crt")

	_, _, bIn, bMetrics := startMeshedProxy(t, bin, dstAddr, appAddr, idAddr, anchors, booksID, tokenFile("books-token"))
	// impostor.default is served by the books proxy but advertised with
	// another identity: its certificate cannot prove it.
	const impostorSvc, reviewsID = "impostor.default.svc.cluster.local:7000", "reviews.default.serviceaccount.identity.linkerd.cluster.local"
	require.NoError(t, os.WriteFile(endpoints, []byte(fmt.Sprintf(
		"- authority: %s\n  endpoints:\n  - addr: %s\n    h2: true\n    identity: %s\n"+
			"- authority: %s\n  endpoints:\n  - addr: %s\n    h2: true\n    identity: %s\n",
		books, bIn, booksID, impostorSvc, bIn, reviewsID)), 0o644))
	dst.waitLog(t, loadedEndpointsRe)
	_, aOut, _, aMetrics := startMeshedProxy(t, bin, dstAddr, appAddr, idAddr, anchors, webID, tokenFile("web-token"))
	for _, addr := range []string{aMetrics, bMetrics} {
		require.Eventually(t, func() bool { return ready(addr) == 200 }, timeout, 20*time.Millisecond, "certified and ready")
	}

	req, err := http.NewRequest("GET", "http://"+aOut+"/books/1", nil)
	require.NoError(t, err)
	req.Host = books
	resp, err := http.DefaultClient.Do(req)
	require.NoError(t, err)
	body, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	assert.Equal(t, 200, resp.StatusCode, "%s", body)
	assert.Equal(t, "HTTP/1.1 client="+webID, string(body), "the app sees the calling proxy's identity")

	// An endpoint whose advertised identity its certificate does not
	// prove: 502 with l5d-proxy-error naming the identity check, and
	// nothing in plaintext instead.
	before := appRequests.Load()
	req, err = http.NewRequest("GET", "http://"+aOut+"/books/1", nil)
	require.NoError(t, err)
	req.Host = impostorSvc
	resp, err = http.DefaultClient.Do(req)
	require.NoError(t, err)
	body, _ = io.ReadAll(resp.Body)
	resp.Body.Close()
	assert.Equal(t, http.StatusBadGateway, resp.StatusCode, "%s", body)
	assert.Contains(t, resp.Header.Get("L5d-Proxy-Error"), reviewsID, "the error names the identity expected")
	assert.Equal(t, before, appRequests.Load(), "nothing reached the app")

	// A token for another service account: refused, and the proxy stays
	// not ready.
	impostor, _, _, iMetrics := startMeshedProxy(t, bin, dstAddr, appAddr, idAddr, anchors,
		reviewsID, tokenFile("web-token"))
	impostor.waitLog(t, regexp.MustCompile(`(certification failed)`))
	assert.Equal(t, http.StatusServiceUnavailable, ready(iMetrics))
}
