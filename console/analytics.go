package console

import (
	"cmp"
	"net/http"
	"slices"
	"strings"
	"time"

	"github.com/changegate/changegate/deliverylog"
)

// consoleWindows are the analytics windows, in the selector's order.
var consoleWindows = []string{"1h", "6h", "24h", "7d"}

// consoleTopN is how many operations or collections a group lists; the
// rest are summed in one line.
const consoleTopN = 10

// Chart geometry: a label column, then the bars, then the figure.
const (
	chartLabelW = 190
	chartBarW   = 520
	chartValueW = 110
	chartRowH   = 26
	chartLabelN = 26 // label characters shown; the whole name is the title
)

// consoleAnalytics is the analytics page: deliverylog.Analytics of one
// window, with its charts.
type consoleAnalytics struct {
	Window       string
	Windows      []string
	Since, Until time.Time
	Sinks, Rules []consoleGroup
	Covers       []string
	// Mode and Retention are [delivery_log]'s mode and retention in force.
	Mode, Retention string
	// SinkOutcomes and RuleOutcomes chart events by outcome; SinkLatency
	// and RuleLatency p50, p95 and p99.
	SinkOutcomes, RuleOutcomes, SinkLatency, RuleLatency consoleChart
	Outcomes                                             []string // the legend
}

type consoleGroup struct {
	Name                    string
	Attempts, Events        int64
	Outcomes                []consoleCount
	Operations, Collections []consoleCount
	Latency                 deliverylog.Latency
}

type consoleCount struct {
	Name string
	N    int64
}

// consoleChart is a horizontal bar chart drawn as SVG by the template:
// one row per group.
type consoleChart struct {
	Width, Height int
	Rows          []chartRow
}

type chartRow struct {
	Label, Title string // Label is cut to chartLabelN; Title is whole
	TextY        int
	Value        string // the figure at the end of the row
	ValueX       int
	Bars         []chartBar
}

type chartBar struct {
	X, Y, W, H float64
	Class      string // a CSS class of console.css: the colour
	Title      string
}

// outcomeClass is the chart class of an outcome: one per known outcome.
func outcomeClass(o string) string {
	if deliverylog.Outcome(o).Valid() {
		return "o-" + o
	}
	return "o-other"
}

// counts returns m's counts, largest first (by name among equals), the
// first n and the rest summed as "(N others)".
func counts[K ~string](m map[K]int64, n int) []consoleCount {
	out := make([]consoleCount, 0, len(m))
	for k, v := range m {
		out = append(out, consoleCount{Name: string(k), N: v})
	}
	slices.SortFunc(out, func(a, b consoleCount) int {
		return cmp.Or(cmp.Compare(b.N, a.N), cmp.Compare(a.Name, b.Name))
	})
	if n > 0 && len(out) > n {
		var rest int64
		for _, c := range out[n:] {
			rest += c.N
		}
		out = append(out[:n], consoleCount{Name: "(" + num(len(out)-n) + " others)", N: rest})
	}
	return out
}

func num(n int) string { return consoleNum(float64(n)) }

// outcomeCounts returns g's events by outcome, in deliverylog.Outcomes
// order, then any other outcome stored.
func outcomeCounts(g deliverylog.Group) []consoleCount {
	var out []consoleCount
	for _, o := range deliverylog.Outcomes {
		if n := g.ByOutcome[o]; n > 0 {
			out = append(out, consoleCount{Name: string(o), N: n})
		}
	}
	other := map[string]int64{}
	for o, n := range g.ByOutcome {
		if !o.Valid() && n > 0 {
			other[string(o)] = n
		}
	}
	return append(out, counts(other, consoleTopN)...)
}

func cut(s string, n int) string {
	r := []rune(s)
	if len(r) <= n {
		return s
	}
	return string(r[:n-1]) + "…"
}

// outcomeChart stacks each group's events by outcome, scaled to the
// largest group.
func outcomeChart(groups []consoleGroup) consoleChart {
	c := consoleChart{Width: chartLabelW + chartBarW + chartValueW, Height: max(1, len(groups)) * chartRowH}
	var most int64
	for _, g := range groups {
		most = max(most, g.Events)
	}
	for i, g := range groups {
		y := float64(i*chartRowH + 4)
		row := chartRow{Label: cut(g.Name, chartLabelN), Title: g.Name, TextY: i*chartRowH + 17, Value: num(int(g.Events)) + " events",
			ValueX: chartLabelW + chartBarW + 6}
		x := float64(chartLabelW)
		for _, o := range g.Outcomes {
			if most == 0 {
				break
			}
			w := float64(o.N) / float64(most) * chartBarW
			row.Bars = append(row.Bars, chartBar{X: x, Y: y, W: w, H: chartRowH - 8, Class: outcomeClass(o.Name),
				Title: o.Name + ": " + num(int(o.N))})
			x += w
		}
		c.Rows = append(c.Rows, row)
	}
	return c
}

// latencyChart draws each group's p50, p95 and p99 as three thin bars,
// scaled to the largest p99.
func latencyChart(groups []consoleGroup) consoleChart {
	c := consoleChart{Width: chartLabelW + chartBarW + chartValueW, Height: max(1, len(groups)) * chartRowH}
	var most float64
	for _, g := range groups {
		most = max(most, g.Latency.P99, g.Latency.P95, g.Latency.P50)
	}
	for i, g := range groups {
		row := chartRow{Label: cut(g.Name, chartLabelN), Title: g.Name, TextY: i*chartRowH + 17,
			Value: "p99 " + consoleNum(g.Latency.P99) + " ms", ValueX: chartLabelW + chartBarW + 6}
		if g.Latency.Count == 0 {
			row.Value = "no attempts"
		}
		for j, p := range []struct {
			name string
			v    float64
		}{{"p50", g.Latency.P50}, {"p95", g.Latency.P95}, {"p99", g.Latency.P99}} {
			if most == 0 {
				break
			}
			row.Bars = append(row.Bars, chartBar{X: chartLabelW, Y: float64(i*chartRowH + 4 + j*6), W: p.v / most * chartBarW, H: 5,
				Class: "lat-" + p.name, Title: p.name + ": " + consoleNum(p.v) + " ms"})
		}
		c.Rows = append(c.Rows, row)
	}
	return c
}

// shortDuration is d as time.Duration writes it, without zero minutes
// and seconds ("72h", not "72h0m0s").
func shortDuration(d time.Duration) string {
	s := d.String()
	if strings.HasSuffix(s, "m0s") {
		s = strings.TrimSuffix(s, "0s")
	}
	if strings.HasSuffix(s, "h0m") {
		s = strings.TrimSuffix(s, "0m")
	}
	return s
}

func groupView(g deliverylog.Group) consoleGroup {
	return consoleGroup{Name: g.Name, Attempts: g.Attempts, Events: g.Events, Outcomes: outcomeCounts(g),
		Operations: counts(g.ByOperation, consoleTopN), Collections: counts(g.ByCollection, consoleTopN), Latency: g.Latency}
}

func analyticsView(a deliverylog.Analytics) *consoleAnalytics {
	v := &consoleAnalytics{Window: a.Window, Windows: consoleWindows, Since: a.Since, Until: a.Until, Covers: a.Covers}
	for _, g := range a.Sinks {
		v.Sinks = append(v.Sinks, groupView(g))
	}
	for _, g := range a.Rules {
		v.Rules = append(v.Rules, groupView(g))
	}
	v.SinkOutcomes, v.RuleOutcomes = outcomeChart(v.Sinks), outcomeChart(v.Rules)
	v.SinkLatency, v.RuleLatency = latencyChart(v.Sinks), latencyChart(v.Rules)
	for _, o := range deliverylog.Outcomes {
		v.Outcomes = append(v.Outcomes, string(o))
	}
	return v
}

func (c *Console) consoleAnalytics(r *http.Request, p *consolePage) int {
	if c.api.Deliveries() == nil {
		p.Error = errNoDeliveryLog.Error()
		return http.StatusNotFound
	}
	window := r.URL.Query().Get("window")
	if window == "" {
		window = "24h"
	}
	a, err := c.api.Analytics(r.Context(), window)
	if err != nil {
		p.Error = err.Error()
		p.Analytics = &consoleAnalytics{Windows: consoleWindows}
		return deliveryCode(err)
	}
	p.Analytics = analyticsView(a)
	dc := c.gw.Config().DeliveryLog
	p.Analytics.Mode, p.Analytics.Retention = dc.Mode, shortDuration(dc.Retention)
	return http.StatusOK
}
