package cpaddr

import (
	"testing"

	"github.com/stretchr/testify/assert"
)

func TestSplit(t *testing.T) {
	for _, tc := range []struct {
		in   string
		want []string
		err  string
	}{
		{in: "127.0.0.1:8086,127.0.0.1:9086", want: []string{"127.0.0.1:8086", "127.0.0.1:9086"}},
		{in: " [::1]:8086 , cp.example:8086", want: []string{"[::1]:8086", "cp.example:8086"}},
		{in: "127.0.0.1:8086,", err: `address 2 of "127.0.0.1:8086," is empty`},
		{in: "127.0.0.1:8086,127.0.0.1", err: `address 2 of "127.0.0.1:8086,127.0.0.1"`},
		{in: "127.0.0.1:8086,:9086", err: "a host and a port are required"},
		{in: "a:1,a:1", err: "(a:1) is given twice"},
	} {
		got, err := Split(tc.in)
		if tc.err != "" {
			assert.ErrorContains(t, err, tc.err, "%q", tc.in)
			continue
		}
		assert.NoError(t, err, "%q", tc.in)
		assert.Equal(t, tc.want, got, "%q", tc.in)
	}
}
