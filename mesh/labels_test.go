package mesh

import (
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"strings"
	"testing"

	"github.com/inmesh/inmesh/internal/testutil"
	origproto "github.com/inmesh/inmesh/orig-proto"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// A client chooses the Host of its requests. With WithLocalAuthorities,
// the inbound stack's authority label takes only the server's own
// authorities; any other Host is counted under authority="other", however
// many a client sends before the server's own authority comes.
func TestInboundLabelsOnlyLocalAuthorities(t *testing.T) {
	const local = "books.default.svc.cluster.local:7000"
	m := testutil.NewMetrics(t)
	app := http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) { io.WriteString(w, "ok") })
	srv := NewServer(app, WithLocalAuthorities(local), WithMaxAuthorities(4), WithMeterProvider(m.Provider), WithLogger(quiet))
	defer srv.Close()
	hs := origproto.NewServer(srv)
	hs.ErrorLog = quietLog
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	done := make(chan struct{})
	go func() {
		defer close(done)
		if err := hs.Serve(srv.Listener(lis)); !errors.Is(err, http.ErrServerClosed) {
			t.Errorf("serve: %v", err)
		}
	}()
	defer func() { hs.Close(); <-done }()

	c := &http.Client{Timeout: testutil.Timeout}
	get := func(host string) {
		req, _ := http.NewRequest("GET", "http://"+lis.Addr().String()+"/", nil)
		req.Host = host
		resp, err := c.Do(req)
		require.NoError(t, err)
		io.Copy(io.Discard, resp.Body)
		resp.Body.Close()
	}
	// An attacker's requests first, then the service's own traffic.
	for i := range 10 {
		get(fmt.Sprintf("junk%d.attacker.example:80", i))
	}
	get(local)

	var junk []string
	for _, l := range m.Lines(t, "request_total") {
		if strings.Contains(l, "attacker.example") {
			junk = append(junk, l)
		}
	}
	assert.Empty(t, junk, "client-chosen Hosts became authority label values")
	assert.Equal(t, "1", m.Value(t, "request_total", `authority="`+local+`"`, `direction="inbound"`),
		"the service's own authority lost its series: %v", m.Lines(t, "request_total"))
}
