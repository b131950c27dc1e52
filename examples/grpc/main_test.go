package main

import (
	"bytes"
	"regexp"
	"strconv"
	"strings"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"go.uber.org/goleak"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

// rows returns the table's rows by their first field, each split in
// fields: a route's row, then its backend's (first field "└─►").
func rows(text string) map[string][][]string {
	out := map[string][][]string{}
	route := ""
	for _, line := range strings.Split(text, "\n") {
		f := strings.Fields(line)
		switch {
		case len(f) == 8 && strings.HasPrefix(f[0], "interop-"):
			route = f[0]
			out[route] = append(out[route], f)
		case len(f) == 9 && f[0] == "└─►" && route != "":
			out[route] = append(out[route], f)
		}
	}
	return out
}

// The program's table shows what the GRPCRoutes of interop.yaml do to the
// calls: the unary route retries the calls that failed UNAVAILABLE and
// they all succeed, the slow route's timeout ends every call, the stream
// route carries the streams; and each server saw only the client's
// identity, over mTLS, while refusing plaintext by the inbound policy.
func TestExampleTable(t *testing.T) {
	var out bytes.Buffer
	require.NoError(t, run(options{calls: 100}, &out))
	text := out.String()
	t.Log("\n" + text)
	r := rows(text)
	// Fields: ROUTE SUCCESS RPS P50 P95 P99 TIMEOUTS RETRIES; a backend's:
	// └─► BACKEND SUCCESS RPS P50 P95 P99 TIMEOUTS -.
	require.Len(t, r["interop-unary"], 2, "the route and its backend")
	unary, unaryBackend := r["interop-unary"][0], r["interop-unary"][1]
	assert.Equal(t, "100.00%", unary[1], "retries hide the failures")
	assert.NotEqual(t, "0.00%", unary[7], "the route retried")
	assert.Equal(t, "interop:10000", unaryBackend[1])
	assert.NotEqual(t, "100.00%", unaryBackend[2], "the backend's attempts include the failed ones")

	require.Len(t, r["interop-slow"], 2)
	slow := r["interop-slow"][0]
	assert.Equal(t, "0.00%", slow[1], "no slow call succeeds")
	assert.Equal(t, "100.00%", slow[6], "every slow call timed out")
	assert.Equal(t, "0.00%", slow[7], "no retries on the slow route")

	require.Len(t, r["interop-stream"], 2)
	assert.Equal(t, "100.00%", r["interop-stream"][0][1])

	// Server view: the instances saw only the client, by its certificate
	// (the balancer decides how many calls each got).
	served := 0
	for _, inst := range []string{"interop-0", "interop-1"} {
		m := regexp.MustCompile(inst + ` +127\.0\.0\.1:\d+ +(\d+) +\d+  (.*)\n`).FindStringSubmatch(text)
		require.NotNil(t, m, inst)
		n, err := strconv.Atoi(m[1])
		require.NoError(t, err)
		served += n
		if n > 0 {
			assert.Equal(t, "web.default.serviceaccount.identity.linkerd.cluster.local ×"+m[1], m[2], inst)
		}
	}
	assert.Greater(t, served, 100, "the unary, slow and stream calls")
	assert.Contains(t, text, "inbound policy in force: a plaintext call to either instance is refused PERMISSION_DENIED")
	assert.Contains(t, text, "OK: every unary call succeeded (20 retried once)")
}

// Without the route's retry annotations the flaky calls fail, and the
// program says so and fails.
func TestExampleFailsWithoutRetries(t *testing.T) {
	manifests := strings.Replace(string(interopManifests), "retry.linkerd.io/grpc: unavailable", "retry.linkerd.io/grpc: internal", 1)
	require.NotEqual(t, string(interopManifests), manifests)
	var out bytes.Buffer
	err := run(options{calls: 20, quiet: true, manifests: []byte(manifests)}, &out)
	require.Error(t, err)
	assert.Contains(t, err.Error(), "UnaryCall: 16 of 20 calls ended OK")
	assert.Contains(t, err.Error(), "interop-unary: want 4 retries")
	assert.Contains(t, out.String(), "FAILED:")
}
