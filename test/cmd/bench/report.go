package main

import (
	"fmt"
	"os"
	"runtime"
	"strings"
	"time"
)

func (b *bench) report(args []string, started time.Time, loadBefore, loadAfter string) string {
	var s strings.Builder
	host, _ := os.Hostname()
	fmt.Fprintf(&s, "Command: `go run ./test/cmd/bench %s`  \n", strings.Join(args, " "))
	fmt.Fprintf(&s, "Date: %s (%s in all)  \n", started.UTC().Format("2006-01-02 15:04 MST"), time.Since(started).Round(time.Second))
	fmt.Fprintf(&s, "Machine: %s, nproc %d, %s; %s %s/%s  \n", host, runtime.NumCPU(), machine(), runtime.Version(), runtime.GOOS, runtime.GOARCH)
	fmt.Fprintf(&s, "Load average (1/5/15 min): %s before, %s after  \n", loadBefore, loadAfter)
	pin := b.pin.desc
	if pin == "" {
		pin = "not pinned"
	}
	fmt.Fprintf(&s, "CPU pinning (-cpus): %s\n\n", pin)
	if b.otlp != nil {
		sampler := os.Getenv("OTEL_TRACES_SAMPLER")
		if sampler == "" {
			sampler = "the default (parentbased_always_on)"
		} else if arg := os.Getenv("OTEL_TRACES_SAMPLER_ARG"); arg != "" {
			sampler += " " + arg
		}
		fmt.Fprintf(&s, "Tracing on (-otlp): OTLP/HTTP to a receiver in the bench process, sampler %s; %d spans received in all\n\n", sampler, b.otlp.SpanCount())
	}
	if len(b.result) == 0 {
		b.limitReport(&s)
		b.replReport(&s)
		return s.String()
	}
	s.WriteString("| # | scenario | changes | events/s | vs ceiling | vs naive | consumer CPU µs/event | mongowire+receiver CPU µs/event | consumer peak RSS | p50 | p99 | p99.9 | max | notes |\n")
	s.WriteString("|---|---|--:|--:|--:|--:|--:|--:|--:|--:|--:|--:|--:|---|\n")
	minimal := map[string]*result{} // the minimal consumer's row of each pair
	for _, r := range b.result {
		if r.minimal && r.err == nil && r.events > 0 {
			minimal[r.pair] = r
		}
	}
	for _, r := range b.result {
		if r.err != nil {
			fmt.Fprintf(&s, "| %d | %s | FAILED: %s | | | | | | | | | | | |\n", r.id, r.name, oneLine(r.err.Error()))
			continue
		}
		note := r.note
		if m := minimal[r.pair]; m != nil && !r.minimal && r.events > 0 && m.cpu > 0 {
			x := (float64(r.cpu) / float64(r.events)) / (float64(m.cpu) / float64(m.events))
			note = strings.TrimPrefix(note+fmt.Sprintf("; CPU per event %.2f× the minimal consumer's (row %d, same run)", x, m.id), "; ")
		}
		rate := r.rate()
		vsCeil, vsNaive := "", ""
		if r.ceiling > 0 && r.id >= 4 && r.id != 7 {
			vsCeil = fmt.Sprintf("%.0f%% of %s", 100*rate/r.ceiling, r.ceilName)
		}
		if b.naive > 0 && r.id >= 4 && r.id != 7 {
			vsNaive = fmt.Sprintf("%.1f×", rate/b.naive)
		}
		perEvent := func(d time.Duration) string {
			if r.events == 0 || d == 0 {
				return "—"
			}
			return fmt.Sprintf("%.1f", float64(d.Microseconds())/float64(r.events))
		}
		p50, p99, p999, pmax := "—", "—", "—", "—"
		if r.lat != nil {
			p50, p99, p999, pmax = fmtDur(r.lat.p50), fmtDur(r.lat.p99), fmtDur(r.lat.p999), fmtDur(r.lat.max)
		}
		fmt.Fprintf(&s, "| %d | %s | %d | %.0f | %s | %s | %s | %s | %.0f MB | %s | %s | %s | %s | %s |\n",
			r.id, r.name, r.events, rate, vsCeil, vsNaive, perEvent(r.cpu), perEvent(r.envCPU),
			float64(r.rss)/(1<<20), p50, p99, p999, pmax, note)
	}
	b.limitReport(&s)
	b.replReport(&s)
	return s.String()
}

func fmtDur(d time.Duration) string {
	switch {
	case d >= 10*time.Second:
		return fmt.Sprintf("%.0f s", d.Seconds())
	case d >= time.Second:
		return fmt.Sprintf("%.2f s", d.Seconds())
	case d >= 10*time.Millisecond:
		return fmt.Sprintf("%.0f ms", float64(d)/float64(time.Millisecond))
	default:
		return fmt.Sprintf("%.1f ms", float64(d)/float64(time.Millisecond))
	}
}

func oneLine(s string) string {
	s = strings.ReplaceAll(s, "\n", " ")
	s = strings.ReplaceAll(s, "|", "/")
	if len(s) > 300 {
		s = s[:300] + "..."
	}
	return s
}
