package manifest

import (
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// An endpoint's zone in the endpoints file: the zone field, or the zone
// label, is the endpoint's "zone" label (what Linkerd's controller sends
// and zone-aware balancing reads); the two must agree, and an empty or
// non-string zone is refused naming the field.
func TestParseEndpointsZone(t *testing.T) {
	for _, tc := range []struct {
		name, entry string
		want        map[string]string // the endpoint's labels
		err         string
	}{
		{"zone field", "{addr: 10.0.0.1:80, zone: zone-a}", map[string]string{"zone": "zone-a"}, ""},
		{"zone label", "{addr: 10.0.0.1:80, labels: {zone: zone-a}}", map[string]string{"zone": "zone-a"}, ""},
		{"both, agreeing", "{addr: 10.0.0.1:80, zone: zone-a, labels: {zone: zone-a, pod: p}}", map[string]string{"zone": "zone-a", "pod": "p"}, ""},
		{"zone beside labels", "{addr: 10.0.0.1:80, zone: zone-b, labels: {pod: p}}", map[string]string{"zone": "zone-b", "pod": "p"}, ""},
		{"no zone", "{addr: 10.0.0.1:80}", nil, ""},
		{"both, differing", "{addr: 10.0.0.1:80, zone: zone-a, labels: {zone: zone-b}}", nil, `[0].endpoints[0].zone: "zone-a" differs from labels.zone "zone-b"`},
		{"empty", "{addr: 10.0.0.1:80, zone: ''}", nil, "[0].endpoints[0].zone: must not be empty"},
		{"not a string", "{addr: 10.0.0.1:80, zone: [a]}", nil, "[0].endpoints[0].zone"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			got, err := ParseEndpoints([]byte("- authority: web.default.svc.cluster.local:80\n  endpoints: [" + tc.entry + "]\n"))
			if tc.err != "" {
				require.Error(t, err)
				assert.Contains(t, err.Error(), tc.err)
				return
			}
			require.NoError(t, err)
			eps := got["web.default.svc.cluster.local:80"]
			require.Len(t, eps, 1)
			assert.Equal(t, tc.want, eps[0].Labels)
		})
	}
}
