//go:build race

package app_test

// raceEnabled: the race detector is on (it multiplies allocations and slows
// large copies tenfold, so memory bounds are not measured under it).
const raceEnabled = true
