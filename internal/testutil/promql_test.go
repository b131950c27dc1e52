package testutil

import (
	"testing"

	"github.com/stretchr/testify/assert"
)

// Select reads selectors as Prometheus does: regular expressions are
// anchored, and an absent label is the empty string.
func TestSelect(t *testing.T) {
	text := `# TYPE tcp_open_total counter
tcp_open_total{authority="books.default.svc.cluster.local:7000",peer="dst"} 2
tcp_open_total{authority="web.default.svc.cluster.local:80",peer="dst"} 3
tcp_open_total{peer="src",tls="disabled"} 4
tcp_open_totals{peer="src"} 5
`
	for _, tc := range []struct {
		matchers []string
		sum      float64
	}{
		{nil, 9},
		{[]string{`peer="dst"`}, 5},
		{[]string{`authority=~"^books.*"`}, 2},
		{[]string{`authority=~"books"`}, 0}, // anchored
		{[]string{`authority=""`}, 4},       // absent
		{[]string{`authority!=""`, `peer!~"s.*"`}, 5},
	} {
		lines, sum := Select(t, text, "tcp_open_total", tc.matchers...)
		assert.Equal(t, tc.sum, sum, "%v: %v", tc.matchers, lines)
	}
}
