package destination_test

import (
	"testing"

	"github.com/inmesh/inmesh/destination"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// The workload forms of Linkerd's policy controller
// (policy-controller/grpc/src/workload.rs): "ns:pod" and JSON with ns and
// one of pod and external_workload. Dial refuses any other, showing the
// expected form, instead of a watch that the control plane refuses later.
func TestParseWorkload(t *testing.T) {
	for _, tc := range []struct {
		in, ns, name, err string
	}{
		{in: "default:books-0", ns: "default", name: "books-0"},
		{in: `{"ns":"default","pod":"books-0"}`, ns: "default", name: "books-0"},
		{in: `{"ns":"default","external_workload":"vm-1"}`, ns: "default", name: "vm-1"},
		{in: "books", err: `workload "books" is not of the form NS:POD (such as default:web-0), nor Linkerd's JSON (such as {"ns":"default","pod":"web-0"})`},
		{in: "default/books-0", err: "is not of the form NS:POD"},
		{in: ":books-0", err: "is not of the form NS:POD"},
		{in: "default:", err: "is not of the form NS:POD"},
		{in: `{"ns":"default"}`, err: `name one of "pod" and "external_workload"`},
		{in: `{"ns":"default","pod":"a","external_workload":"b"}`, err: `name one of "pod" and "external_workload"`},
		{in: `{"pod":"a"}`, err: `no "ns"`},
		{in: `{"ns":"default","pod":`, err: "want NS:POD"},
	} {
		t.Run(tc.in, func(t *testing.T) {
			ns, name, err := destination.ParseWorkload(tc.in)
			if tc.err != "" {
				assert.ErrorContains(t, err, tc.err)
				_, derr := destination.Dial("127.0.0.1:1", destination.WithWorkload(tc.in))
				assert.ErrorContains(t, derr, "destination: WithWorkload: workload")
				assert.ErrorContains(t, derr, tc.err)
				return
			}
			require.NoError(t, err)
			assert.Equal(t, tc.ns, ns)
			assert.Equal(t, tc.name, name)
			c, err := destination.Dial("127.0.0.1:1", destination.WithWorkload(tc.in))
			require.NoError(t, err)
			require.NoError(t, c.Close())
		})
	}
}
