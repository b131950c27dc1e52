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
// pod whose Servers the InboundServerPolicies watch returns; another form
// is refused with InvalidArgument and the watch ends with that error.
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
		{"books-0", ""},
		{"default:", ""},
		{`{"ns":"default","name":"books-0"}`, ""},
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
