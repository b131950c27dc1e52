package main

import (
	"bytes"
	"regexp"
	"strconv"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// The demo with short phases: the callers' requests fail only where they
// were sent to the workload that died (in flight at its death, or before
// its death reached the answers), never for the lost control-plane
// replica or etcd member; the
// dead workload answers nothing after the losses and leaves the answers
// each caller holds; the others share its traffic.
func TestFleetDemoPrintsWhatTheCallersSaw(t *testing.T) {
	var out bytes.Buffer
	// A short TTL: the dead workload's lease runs it (see run).
	require.NoError(t, run(options{duration: 1500 * time.Millisecond, instances: 3, workers: 2, ttl: 5 * time.Second}, &out))
	text := out.String()
	t.Log(text)
	num := func(s string) int64 {
		n, err := strconv.ParseInt(s, 10, 64)
		require.NoError(t, err)
		return n
	}
	row := func(name string) []string {
		m := regexp.MustCompile(`(?m)^` + regexp.QuoteMeta(name) + `\s+(\S+(?: \(\d+\))?)\s+(\S+(?: \(\d+\))?)$`).FindStringSubmatch(text)
		require.NotNil(t, m, "no row %q", name)
		return m[1:]
	}
	requests, failed, atDead := row("sent"), row("failed"), row("  sent to the dead workload")
	for i, phase := range []string{"before", "after"} {
		assert.Positive(t, num(requests[i]), "requests %s the losses", phase)
		assert.Equal(t, failed[i], atDead[i], "%s the losses, every failure was a request sent to the dead workload", phase)
	}
	assert.Equal(t, "0.0% (0)", row("books-1 (killed)")[1], "the dead workload answers no request started after its death")
	for _, name := range []string{"books-0", "books-2", "authors-0", "authors-1", "authors-2"} {
		r := row(name)
		assert.NotEqual(t, "-", r[1])
		assert.NotContains(t, r[1], "0.0% (0)", "%s answers after the losses", name)
	}
	assert.Regexp(t, `books-1 left the answers each caller holds \d[^ ]* and \d[^ ]* after it died`, text)
	assert.Regexp(t, `etcd after the loss: member\d leads`, text)
}
