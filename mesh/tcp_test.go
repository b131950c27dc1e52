package mesh

import (
	"io"
	"net/http"
	"net/http/httptest"
	"regexp"
	"strings"
	"testing"

	"github.com/inmesh/inmesh/internal/testutil"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// The outbound stack labels a connection it dials with its socket's
// address, as Linkerd's target_addr is, not with the address it was asked
// for, which for a request on the default route is its client's Host as
// the client spelled it: one server reached under 50 spellings of its
// address (leading zeros in the port, as net.Dial accepts) was 50
// target_addr series in every tcp_* family, each as long as the client
// liked.
func TestTCPTargetAddrIsTheSocketAddress(t *testing.T) {
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
	re := regexp.MustCompile(`target_addr="([^"]*)"`)
	addrs := map[string]bool{}
	for _, l := range m.Lines(t, "tcp_open_total") {
		if sm := re.FindStringSubmatch(l); sm != nil {
			addrs[sm[1]] = true
		}
	}
	longest := 0
	for a := range addrs {
		longest = max(longest, len(a))
	}
	assert.Len(t, addrs, 1, "one server, one target_addr; got %d values, the longest %d bytes", len(addrs), longest)
	assert.True(t, addrs[strings.TrimPrefix(srv.URL, "http://")], "target_addr is the server's socket address")
}
