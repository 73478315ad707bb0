// A Go program whose CPU time goes 2:1 to two functions on goroutines of their own, for
// the tests of Go stacks: each goroutine's stack ends in the runtime's top frame
// (runtime.goexit), which a whole stack must reach.
//
// Usage: spin MILLISECONDS
package main

import (
	"os"
	"strconv"
	"sync"
	"time"
)

//go:noinline
func spinHot(until time.Time) uint64 {
	var x uint64 = 1
	for time.Now().Before(until) {
		for i := 0; i < 10000; i++ {
			x = x*6364136223846793005 + 1442695040888963407
		}
	}
	return x
}

//go:noinline
func spinCold(until time.Time) uint64 {
	var x uint64 = 3
	for time.Now().Before(until) {
		for i := 0; i < 10000; i++ {
			x = x*2862933555777941757 + 3037000493
		}
	}
	return x
}

func main() {
	ms, err := strconv.Atoi(os.Args[1])
	if err != nil {
		panic("usage: spin MILLISECONDS")
	}
	duration := time.Duration(ms) * time.Millisecond
	start := time.Now()
	var wg sync.WaitGroup
	var sink uint64
	var mu sync.Mutex
	run := func(work func(time.Time) uint64, share time.Duration) {
		defer wg.Done()
		v := work(start.Add(share))
		mu.Lock()
		sink ^= v
		mu.Unlock()
	}
	// One goroutine each, in turn, so the split holds on any number of CPUs.
	wg.Add(1)
	go run(spinHot, duration*2/3)
	wg.Wait()
	start = time.Now()
	wg.Add(1)
	go run(spinCold, duration/3)
	wg.Wait()
	println("spin done", sink != 42)
}
