package destination_test

import (
	"context"
	"testing"

	"github.com/inmesh/inmesh/controlplane"
	"github.com/inmesh/inmesh/destination"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
)

const booksPodYAML = `apiVersion: v1
kind: Pod
metadata: {name: books-0, namespace: default, labels: {app: books}}
spec:
  containers: [{name: books, ports: [{name: http, containerPort: 7000}]}]
---
apiVersion: policy.linkerd.io/v1beta3
kind: Server
metadata: {name: books-http, namespace: default}
spec:
  podSelector: {matchLabels: {app: books}}
  port: http
`

// WithWorkload's string goes to the control plane as given: the forms
// Linkerd's proxy sends (policy-controller/grpc/src/workload.rs) name the
// pod whose Servers the InboundServerPolicies watch returns (another form
// is refused by Dial: TestParseWorkload).
func TestWithWorkloadForms(t *testing.T) {
	store := controlplane.NewStore()
	store.SetManifests(resources(t, booksPodYAML))
	cp := servePolicies(t, holdListener(t), store)
	for _, tc := range []struct {
		workload string
		server   string // the Server's name, or empty for a refusal
	}{
		{"default:books-0", "books-http"},
		{destination.PolicyWorkload("default", "books-0"), "books-http"},
		{`{"ns":"default","pod":"books-0"}`, "books-http"},
	} {
		c := newTestClient(t, cp.addr, destination.WithWorkload(tc.workload))
		rec := newRecorder[destination.InboundUpdate]()
		stop, err := c.WatchInboundPort(context.Background(), 7000, rec.update)
		require.NoError(t, err, tc.workload)
		u := rec.waitFor(t, tc.workload, func(u destination.InboundUpdate) bool { return u.Server != nil || u.Err != nil })
		if tc.server != "" {
			require.NoError(t, u.Err, tc.workload)
			assert.Equal(t, tc.server, u.Server.Meta.Name, tc.workload)
		} else {
			assert.Nil(t, u.Server, tc.workload)
			assert.Equal(t, codes.InvalidArgument, status.Code(u.Err), "%s: %v", tc.workload, u.Err)
		}
		stop()
	}
}

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
