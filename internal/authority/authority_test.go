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

func TestIsLoopbackHost(t *testing.T) {
	for host, want := range map[string]bool{
		"localhost": true, "localhost:4191": true, "LOCALHOST.:4191": true,
		"127.0.0.1": true, "127.0.0.1:4191": true, "127.1.2.3:80": true,
		"[::1]:4191": true, "[::1]": true, "::1": true, "[::ffff:127.0.0.1]:80": true,
		"": false, "attacker.example:4191": false, "localhost.attacker.example": false,
		"192.0.2.7:4191": false, "[::2]:80": false, "0.0.0.0:4191": false,
	} {
		assert.Equal(t, want, IsLoopbackHost(host), host)
	}
}

func TestNormalizeDefaultPort(t *testing.T) {
	for a, want := range map[string]string{"books": "books:80", "Books.Default.:7000": "books.default:7000", "[::1]": "[::1]:80", "10.0.0.1": "10.0.0.1:80"} {
		got, err := NormalizeDefaultPort(a, "80")
		if assert.NoError(t, err, a) {
			assert.Equal(t, want, got, a)
		}
	}
	for _, a := range []string{"", "a:99999", "[::1", "a b", "a:0"} {
		_, err := NormalizeDefaultPort(a, "80")
		assert.Error(t, err, a)
	}
}
