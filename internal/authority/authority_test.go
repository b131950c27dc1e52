package authority

import (
	"strings"
	"testing"

	"github.com/stretchr/testify/assert"
	"go.uber.org/goleak"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

func TestNormalize(t *testing.T) {
	for in, want := range map[string]string{
		"Web.NS.svc.cluster.local.:8080": "web.ns.svc.cluster.local:8080",
		"10.0.0.1:80":                    "10.0.0.1:80",
		"[::1]:443":                      "[::1]:443",
		"web:1":                          "web:1",
	} {
		got, err := Normalize(in)
		if assert.NoError(t, err, in) {
			assert.Equal(t, want, got)
		}
	}
	for _, in := range []string{"", "web", "web:", "web:0", "web:65536", "web:http", "a b:80", "-a:80", "a..b:80",
		strings.Repeat("a", 64) + ".b:80", "a\r\nb:80", "[::1:80"} {
		_, err := Normalize(in)
		assert.Error(t, err, "%q", in)
	}
}
