package app

import (
	"strings"
	"testing"

	"github.com/changegate/changegate/config"
	"github.com/changegate/changegate/memory"
)

func TestMemorySizing(t *testing.T) {
	parse := func(src string) *config.Config {
		t.Helper()
		cfg, err := config.Parse("gw.toml", []byte(src), nil)
		if err != nil {
			t.Fatal(err)
		}
		return cfg
	}
	const mongo = "[mongo]\nuri = \"mongodb://localhost\"\n"
	box := memory.Container{Limit: 512 << 20, From: "/sys/fs/cgroup/memory/memory.limit_in_bytes"}

	s, err := memorySizing(parse(mongo), box, "")
	if err != nil {
		t.Fatal(err)
	}
	text := strings.Join(SizingText(s), "\n")
	for _, want := range []string{
		"max_in_flight_bytes: 128 MiB (134217728 bytes), 25% of the container memory limit 512 MiB (/sys/fs/cgroup/memory/memory.limit_in_bytes)",
		"GOMEMLIMIT: 460.8 MiB (483183820 bytes), 90% of the container memory limit",
	} {
		if !strings.Contains(text, want) {
			t.Errorf("sizing text lacks %q:\n%s", want, text)
		}
	}

	s, err = memorySizing(parse("max_in_flight_bytes = 268435456\n"+mongo), box, "400MiB")
	if err != nil {
		t.Fatal(err)
	}
	if s.Budget != 256<<20 || s.BudgetFrom != "max_in_flight_bytes at gw.toml:1" || s.GoMemLimit != 0 {
		t.Fatalf("%+v", s)
	}

	_, err = memorySizing(parse("max_in_flight_bytes = 1073741824\n"+mongo), box, "")
	if err == nil || err.Error() != "max_in_flight_bytes: must not exceed the container's memory limit (536870912 bytes), got 1073741824 at gw.toml:1" {
		t.Fatalf("err = %v", err)
	}
}
