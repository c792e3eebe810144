"""The deterministic simulator (chaos/sim/): seeds replay, planted bugs are found."""
