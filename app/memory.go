package app

import (
	"fmt"
	"log/slog"
	"os"

	"github.com/changegate/changegate/config"
	"github.com/changegate/changegate/memory"
)

// MemorySizing returns the byte budget (max_in_flight_bytes) and Go memory
// limit cfg runs with in this container, and where each comes from: the
// configured value, else a share of the container's memory limit
// (memory.BudgetPercent), else memory.DefaultBudget; GOMEMLIMIT from the
// environment, else memory.GoMemLimitPercent of the container's limit. A
// max_in_flight_bytes above the container's limit is an error naming its
// file:line.
func MemorySizing(cfg *config.Config) (memory.Sizing, error) {
	return memorySizing(cfg, memory.ContainerLimit(), os.Getenv("GOMEMLIMIT"))
}

func memorySizing(cfg *config.Config, c memory.Container, goMemLimitEnv string) (memory.Sizing, error) {
	if err := cfg.CheckContainerLimit(c.Limit); err != nil {
		return memory.Sizing{}, err
	}
	at := fmt.Sprintf("%s:%d", cfg.File, cfg.MaxInFlightBytesLine)
	return memory.Size(cfg.MaxInFlightBytes, at, c, goMemLimitEnv), nil
}

// SizingText is the sizing as check prints it: one line for the budget,
// one for the Go memory limit.
func SizingText(s memory.Sizing) []string {
	gl := "GOMEMLIMIT: " + s.GoMemLimitFrom
	if s.GoMemLimit > 0 {
		gl = fmt.Sprintf("GOMEMLIMIT: %s (%d bytes), %s", memory.FormatBytes(s.GoMemLimit), s.GoMemLimit, s.GoMemLimitFrom)
	}
	return []string{
		fmt.Sprintf("max_in_flight_bytes: %s (%d bytes), %s", memory.FormatBytes(s.Budget), s.Budget, s.BudgetFrom),
		gl,
	}
}

// logSizing writes the start-up line of the memory sizing.
func logSizing(log *slog.Logger, s memory.Sizing, goMemLimit int64) {
	args := []any{"max_in_flight_bytes", s.Budget, "budget", memory.FormatBytes(s.Budget), "budget_from", s.BudgetFrom,
		"gomemlimit_from", s.GoMemLimitFrom}
	if s.Container.Limit > 0 {
		args = append(args, "container_limit", s.Container.Limit, "container_limit_file", s.Container.From)
	}
	if goMemLimit > 0 && goMemLimit < 1<<62 {
		args = append(args, "gomemlimit", goMemLimit)
	}
	log.Info("memory budget", args...)
}
