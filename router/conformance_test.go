package router

import (
	"net/http"
	"strings"
	"testing"

	"github.com/inmesh/inmesh/internal/testutil"
	"github.com/inmesh/inmesh/policy"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// TestRequestHeaderModifierConformance runs the cases of the Gateway API
// conformance test httproute-request-header-modifier.go (and its
// manifest) through the router to a real upstream: add appends to the
// values a request has, set replaces them, remove drops them, header
// names are case-insensitive.
func TestRequestHeaderModifierConformance(t *testing.T) {
	hs := func(kv ...string) []policy.Header {
		var out []policy.Header
		for i := 0; i < len(kv); i += 2 {
			out = append(out, policy.Header{Name: kv[i], Value: kv[i+1]})
		}
		return out
	}
	rule := func(path string, m policy.HeaderModifier, up *upstream) policy.HTTPRule {
		return policy.HTTPRule{
			Matches:  []policy.HTTPRouteMatch{{Path: &policy.PathMatch{Kind: policy.PathPrefix, Value: path}}},
			Filters:  []policy.Filter{{RequestHeaders: &m}},
			Backends: to(up.backend("infra-backend-v1")),
		}
	}
	tests := []struct {
		path   string
		sent   map[string]string
		want   map[string]string
		absent []string
	}{
		{"/set", map[string]string{"Some-Other-Header": "val"},
			map[string]string{"Some-Other-Header": "val", "X-Header-Set": "set-overwrites-values"}, nil},
		{"/set", map[string]string{"Some-Other-Header": "val", "X-Header-Set": "some-other-value"},
			map[string]string{"Some-Other-Header": "val", "X-Header-Set": "set-overwrites-values"}, nil},
		{"/add", map[string]string{"Some-Other-Header": "val"},
			map[string]string{"Some-Other-Header": "val", "X-Header-Add": "add-appends-values"}, nil},
		{"/add", map[string]string{"Some-Other-Header": "val", "X-Header-Add": "some-other-value"},
			map[string]string{"Some-Other-Header": "val", "X-Header-Add": "some-other-value,add-appends-values"}, nil},
		{"/remove", map[string]string{"X-Header-Remove": "val"}, nil, []string{"X-Header-Remove"}},
		{"/multiple", map[string]string{"X-Header-Set-2": "set-val-2", "X-Header-Add-2": "add-val-2", "X-Header-Remove-2": "remove-val-2", "Another-Header": "another-header-val"},
			map[string]string{"X-Header-Set-1": "header-set-1", "X-Header-Set-2": "header-set-2", "X-Header-Add-1": "header-add-1",
				"X-Header-Add-2": "add-val-2,header-add-2", "X-Header-Add-3": "header-add-3", "Another-Header": "another-header-val"},
			[]string{"X-Header-Remove-1", "X-Header-Remove-2"}},
		{"/case-insensitivity", map[string]string{"x-header-set": "original-val-set", "x-header-add": "original-val-add", "x-header-remove": "original-val-remove", "Another-Header": "another-header-val"},
			map[string]string{"X-Header-Set": "header-set", "X-Header-Add": "original-val-add,header-add", "Another-Header": "another-header-val"},
			[]string{"X-Header-Remove"}},
	}
	testutil.Run(t, func(t *testing.T, mode testutil.Mode) {
		up := newUpstream(t, nil)
		p := httpPolicy(
			rule("/set", policy.HeaderModifier{Set: hs("X-Header-Set", "set-overwrites-values")}, up),
			rule("/add", policy.HeaderModifier{Add: hs("X-Header-Add", "add-appends-values")}, up),
			rule("/remove", policy.HeaderModifier{Remove: []string{"X-Header-Remove"}}, up),
			rule("/multiple", policy.HeaderModifier{
				Set:    hs("X-Header-Set-1", "header-set-1", "X-Header-Set-2", "header-set-2"),
				Add:    hs("X-Header-Add-1", "header-add-1", "X-Header-Add-2", "header-add-2", "X-Header-Add-3", "header-add-3"),
				Remove: []string{"X-Header-Remove-1", "X-Header-Remove-2"}}, up),
			rule("/case-insensitivity", policy.HeaderModifier{
				Set: hs("X-Header-Set", "header-set"), Add: hs("X-Header-Add", "header-add"), Remove: []string{"X-Header-Remove"}}, up),
		)
		f := newFixture(t, mode, p)
		for _, tt := range tests {
			h := http.Header{}
			for k, v := range tt.sent {
				h[k] = []string{v} // as sent, lower case names included
			}
			resp, _ := f.do(t, "GET", "http://svc.test"+tt.path, "", h)
			require.Equal(t, 200, resp.StatusCode, tt.path)
			got := up.header()
			for k, v := range tt.want {
				assert.Equal(t, v, strings.Join(got.Values(k), ","), "%s: %s", tt.path, k)
			}
			for _, k := range tt.absent {
				assert.Empty(t, got.Values(k), "%s: %s must be removed", tt.path, k)
			}
		}
	})
}
