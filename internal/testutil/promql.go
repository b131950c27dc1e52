package testutil

import (
	"regexp"
	"strconv"
	"strings"
	"testing"
)

var (
	sampleRe  = regexp.MustCompile(`^([a-zA-Z_:][a-zA-Z0-9_:]*)(?:\{(.*)\})? (\S+)$`)
	labelRe   = regexp.MustCompile(`([a-zA-Z_][a-zA-Z0-9_]*)="((?:[^"\\]|\\.)*)"`)
	matcherRe = regexp.MustCompile(`^(\w+)(=~|!~|!=|=)"(.*)"$`)
)

// Select returns the samples of the Prometheus text exposition text that
// the PromQL selector name{matchers...} selects, and the sum of their
// values: what a dashboard or `linkerd viz` query over the series reads.
// Each matcher is label op "value", op one of =, !=, =~ and !~, with
// Prometheus' semantics: a regular expression is anchored, and an absent
// label matches "".
func Select(t testing.TB, text, name string, matchers ...string) (lines []string, sum float64) {
	t.Helper()
	type matcher struct {
		label, op, value string
		re               *regexp.Regexp
	}
	ms := make([]matcher, len(matchers))
	for i, s := range matchers {
		sm := matcherRe.FindStringSubmatch(s)
		if sm == nil {
			t.Fatalf("bad matcher %q", s)
		}
		ms[i] = matcher{label: sm[1], op: sm[2], value: sm[3]}
		if sm[2] == "=~" || sm[2] == "!~" {
			ms[i].re = regexp.MustCompile("^(?:" + sm[3] + ")$")
		}
	}
	for _, line := range strings.Split(text, "\n") {
		sm := sampleRe.FindStringSubmatch(line)
		if sm == nil || sm[1] != name {
			continue
		}
		labels := map[string]string{}
		for _, l := range labelRe.FindAllStringSubmatch(sm[2], -1) {
			labels[l[1]] = l[2]
		}
		ok := true
		for _, m := range ms {
			v := labels[m.label]
			switch m.op {
			case "=":
				ok = ok && v == m.value
			case "!=":
				ok = ok && v != m.value
			case "=~":
				ok = ok && m.re.MatchString(v)
			case "!~":
				ok = ok && !m.re.MatchString(v)
			}
		}
		if !ok {
			continue
		}
		v, err := strconv.ParseFloat(sm[3], 64)
		if err != nil {
			t.Fatalf("value of %q: %v", line, err)
		}
		lines = append(lines, line)
		sum += v
	}
	return lines, sum
}

// Family returns the sample lines of the family name in text, for failure
// messages.
func Family(text, name string) string {
	var b strings.Builder
	for _, line := range strings.Split(text, "\n") {
		if strings.HasPrefix(line, name+"{") || strings.HasPrefix(line, name+" ") {
			b.WriteString(line)
			b.WriteByte('\n')
		}
	}
	return b.String()
}

// Select returns the series of m that the PromQL selector
// name{matchers...} selects (see the function [Select]).
func (m *Metrics) Select(t testing.TB, name string, matchers ...string) (lines []string, sum float64) {
	t.Helper()
	return Select(t, m.Scrape(t), name, matchers...)
}
