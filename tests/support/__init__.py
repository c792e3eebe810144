"""Helpers shared by test modules of every tier (no tests here): test modules import from
``tests.support``, never from one another. Each module groups one subject's helpers; they may
import the product and each other, and nothing from a test module or a conftest."""
