package main

import (
	"bytes"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"go.uber.org/goleak"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

func TestDemoPrintsRouteTable(t *testing.T) {
	var out bytes.Buffer
	// The demo's own default duration: each worker walks the request list in
	// order, the authors requests after /slow's timeout, so one second on a
	// loaded machine could end before any authors request.
	require.NoError(t, run(options{duration: 3 * time.Second, workers: 4}, &out))
	text := out.String()
	t.Log(text)
	assert.Contains(t, text, "1 connection(s) between the peers")
	// Not a terminal: plain lines, no carriage return to fold them.
	assert.NotContains(t, text, "\r")
	assert.Regexp(t, `(?m)^[0-9]+ requests sent; 1 connection\(s\) between the peers$`, text)
	// The peers talk mTLS with identities from the embedded issuer, and
	// the app sees the client's on every request.
	assert.Contains(t, text, "the app saw l5d-client-id web.default.serviceaccount.identity.linkerd.cluster.local\n",
		"every request carried the client's identity")
	for _, route := range []string{"GET /books ", "GET /books/{id}", "POST /books", "GET /flaky", "GET /slow"} {
		assert.Contains(t, text, route)
	}
	assert.Contains(t, text, "authors (HTTPRoutes)")
	// The admin port's inbound policy: web allowed then limited, reviews
	// denied.
	assert.Regexp(t, `web: +[1-9][0-9]* allowed, [1-9][0-9]* limited \(429\)`, text)
	assert.Contains(t, text, "reviews: 3 denied (403)")
	for _, route := range []string{"authors-get", "authors-flaky"} {
		assert.Contains(t, text, route)
	}
	for _, line := range strings.Split(text, "\n") {
		if strings.HasPrefix(line, "authors-get") {
			assert.Contains(t, line, "100.00%", "the HTTPRoute's backend answers")
		}
		if f := strings.Fields(line); len(f) > 3 && f[0] == "authors-flaky" {
			assert.NotEqual(t, "0", f[3], "the route's retry annotations retry the flaky calls")
		}
		if strings.HasPrefix(line, "GET /flaky") {
			assert.Contains(t, line, "100.00%", "retries hide the flaky failures")
		}
		if strings.HasPrefix(line, "GET /slow") {
			assert.Contains(t, line, " 0.00%", "every slow request times out")
		}
	}
}

// The countdown never shows a negative time, however late the last
// requests finish.
func TestRemaining(t *testing.T) {
	for d, want := range map[time.Duration]string{
		2400 * time.Millisecond: "2s", 500 * time.Millisecond: "1s", 0: "0s",
		-400 * time.Millisecond: "0s", -1600 * time.Millisecond: "0s",
	} {
		if got := remaining(d).String(); got != want {
			t.Errorf("remaining(%v) = %s, want %s", d, got, want)
		}
	}
}

// A pipe or a file is not a terminal; the progress is then plain lines.
func TestIsTerminal(t *testing.T) {
	r, w, err := os.Pipe()
	require.NoError(t, err)
	defer r.Close()
	defer w.Close()
	assert.False(t, isTerminal(w))
	assert.False(t, isTerminal(&bytes.Buffer{}))
	f, err := os.Create(filepath.Join(t.TempDir(), "out.txt"))
	require.NoError(t, err)
	defer f.Close()
	assert.False(t, isTerminal(f))
}
