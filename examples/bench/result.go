package main

import (
	"encoding/json"
	"fmt"
	"io"
	"math"
	"slices"
	"strings"
	"text/tabwriter"
)

// figures are the raw measurements of one variant; a field that does not
// apply is left zero and omitted.
type figures struct {
	NsPerOp     float64 `json:"ns_per_op,omitempty"`
	RPS         float64 `json:"rps,omitempty"`
	P50         float64 `json:"p50_ns,omitempty"`
	P99         float64 `json:"p99_ns,omitempty"`
	Allocs      float64 `json:"allocs_per_op,omitempty"`
	Connections float64 `json:"connections,omitempty"`
	MiB         float64 `json:"mib,omitempty"`
	Requests    float64 `json:"requests,omitempty"`
}

// goal is a bound on a ratio: at most Max, at least Min, or both.
type goal struct {
	Min, Max float64 // NaN: no bound on that side
}

var noGoal = goal{math.NaN(), math.NaN()}

func atMost(v float64) goal      { return goal{math.NaN(), v} }
func atLeast(v float64) goal     { return goal{v, math.NaN()} }
func within(lo, hi float64) goal { return goal{lo, hi} }

func (g goal) none() bool { return math.IsNaN(g.Min) && math.IsNaN(g.Max) }

func (g goal) String() string {
	switch {
	case g.none():
		return ""
	case math.IsNaN(g.Min):
		return fmt.Sprintf("<= %g", g.Max)
	case math.IsNaN(g.Max):
		return fmt.Sprintf(">= %g", g.Min)
	}
	return fmt.Sprintf("%g-%g", g.Min, g.Max)
}

func (g goal) met(v float64) bool {
	return (math.IsNaN(g.Min) || v >= g.Min) && (math.IsNaN(g.Max) || v <= g.Max)
}

func (g goal) MarshalJSON() ([]byte, error) {
	if g.none() {
		return []byte("null"), nil
	}
	return json.Marshal(g.String())
}

type spread struct {
	Min float64 `json:"min"`
	Max float64 `json:"max"`
}

// ratio is one compared figure: the median of the per-round ratios and
// their spread.
type ratio struct {
	Name   string  `json:"name,omitempty"`
	Ratio  float64 `json:"ratio"`
	Goal   goal    `json:"goal"`
	Met    *bool   `json:"met"`
	Spread spread  `json:"spread"`
	Note   string  `json:"note,omitempty"`
}

// result is one scenario: its main ratio (candidate against baseline), the
// median figures of both, and further ratios of the same rounds.
type result struct {
	Name string `json:"name"`
	ratio
	Unit      string             `json:"unit,omitempty"`
	Candidate *figures           `json:"candidate,omitempty"`
	Baseline  *figures           `json:"baseline,omitempty"`
	Others    map[string]figures `json:"others,omitempty"`
	Extra     []ratio            `json:"extra,omitempty"`
	Rounds    int                `json:"rounds"`
	Skipped   string             `json:"skipped,omitempty"`
}

// finish fills in whether the goals were met.
func (r *result) finish() {
	set := func(x *ratio) {
		if x.Goal.none() || math.IsNaN(x.Ratio) || r.Skipped != "" {
			x.Met = nil
			return
		}
		m := x.Goal.met(x.Ratio)
		x.Met = &m
	}
	if r.Skipped != "" || r.Candidate == nil {
		r.Ratio = math.NaN()
	}
	set(&r.ratio)
	for i := range r.Extra {
		set(&r.Extra[i])
	}
}

func (r *result) MarshalJSON() ([]byte, error) {
	type plain result
	c := *r
	// JSON has no NaN: a ratio that was not measured is null.
	if math.IsNaN(c.Ratio) {
		return json.Marshal(struct {
			*plain
			Ratio *float64 `json:"ratio"`
		}{(*plain)(&c), nil})
	}
	return json.Marshal((*plain)(&c))
}

// rounds holds the figures of every variant of every round.
type rounds [][]figures

// of returns the per-round ratios f(round) and their median and spread.
func (rs rounds) ratio(name string, g goal, f func([]figures) float64) ratio {
	var v []float64
	for _, r := range rs {
		v = append(v, f(r))
	}
	if len(v) == 0 {
		return ratio{Name: name, Ratio: math.NaN(), Goal: g}
	}
	return ratio{Name: name, Ratio: median(v), Goal: g, Spread: spread{slices.Min(v), slices.Max(v)}}
}

// median returns the per-field medians of variant i over the rounds.
func (rs rounds) median(i int) *figures {
	field := func(get func(figures) float64) float64 {
		var v []float64
		for _, r := range rs {
			v = append(v, get(r[i]))
		}
		return median(v)
	}
	return &figures{
		NsPerOp:     field(func(f figures) float64 { return f.NsPerOp }),
		RPS:         field(func(f figures) float64 { return f.RPS }),
		P50:         field(func(f figures) float64 { return f.P50 }),
		P99:         field(func(f figures) float64 { return f.P99 }),
		Allocs:      field(func(f figures) float64 { return f.Allocs }),
		Connections: field(func(f figures) float64 { return f.Connections }),
		MiB:         field(func(f figures) float64 { return f.MiB }),
		Requests:    field(func(f figures) float64 { return f.Requests }),
	}
}

func median(v []float64) float64 {
	if len(v) == 0 {
		return math.NaN()
	}
	s := slices.Clone(v)
	slices.Sort(s)
	n := len(s)
	if n%2 == 1 {
		return s[n/2]
	}
	return (s[n/2-1] + s[n/2]) / 2
}

func printTable(w io.Writer, results []*result) {
	tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', 0)
	fmt.Fprintln(tw, "scenario\tratio\tgoal\tmet\tspread\tcandidate\tbaseline")
	line := func(name string, x ratio, cand, base string) {
		met := "-"
		if x.Met != nil {
			met = map[bool]string{true: "yes", false: "NO"}[*x.Met]
		}
		r, sp := "-", ""
		if !math.IsNaN(x.Ratio) {
			r = fmt.Sprintf("%.3g", x.Ratio)
			sp = fmt.Sprintf("[%.3g-%.3g]", x.Spread.Min, x.Spread.Max)
		}
		fmt.Fprintf(tw, "%s\t%s\t%s\t%s\t%s\t%s\t%s\n", name, r, x.Goal, met, sp, cand, base)
	}
	for _, r := range results {
		if r.Skipped != "" {
			fmt.Fprintf(tw, "%s\tskipped: %s\t\t\t\t\t\n", r.Name, r.Skipped)
			continue
		}
		line(r.Name, r.ratio, brief(r.Candidate), brief(r.Baseline))
		for _, x := range r.Extra {
			line("  "+x.Name, x, "", "")
		}
	}
	tw.Flush()
	for _, r := range results {
		notes := []string{}
		if r.Note != "" {
			notes = append(notes, r.Note)
		}
		for _, x := range r.Extra {
			if x.Note != "" {
				notes = append(notes, x.Name+": "+x.Note)
			}
		}
		if len(notes) > 0 {
			fmt.Fprintf(w, "%s: %s\n", r.Name, strings.Join(notes, "; "))
		}
	}
}

// brief renders the figures that are set.
func brief(f *figures) string {
	if f == nil {
		return ""
	}
	var parts []string
	if f.Requests > 0 {
		parts = append(parts, fmt.Sprintf("%.0f requests", f.Requests))
	}
	if f.RPS > 0 {
		parts = append(parts, fmt.Sprintf("%.0f req/s", f.RPS))
	}
	if f.P50 > 0 {
		parts = append(parts, "p50 "+dur(f.P50))
	}
	if f.P99 > 0 {
		parts = append(parts, "p99 "+dur(f.P99))
	}
	if f.NsPerOp > 0 && f.P50 == 0 {
		parts = append(parts, dur(f.NsPerOp)+"/op")
	}
	if f.Allocs > 0 {
		parts = append(parts, fmt.Sprintf("%.0f allocs", f.Allocs))
	}
	if f.Connections > 0 {
		parts = append(parts, fmt.Sprintf("%.0f conns", f.Connections))
	}
	if f.MiB != 0 {
		parts = append(parts, fmt.Sprintf("%.1f MiB", f.MiB))
	}
	return strings.Join(parts, ", ")
}

func dur(ns float64) string {
	switch {
	case ns >= 1e6:
		return fmt.Sprintf("%.2fms", ns/1e6)
	case ns >= 1e3:
		return fmt.Sprintf("%.1fµs", ns/1e3)
	}
	return fmt.Sprintf("%.0fns", ns)
}
