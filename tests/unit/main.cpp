#define DOCTEST_CONFIG_IMPLEMENT
#include <doctest/doctest.h>
#include <spdlog/spdlog.h>

int main(int argc, char** argv) {
  // The code under test logs what it does (the holder: every pool it creates); tests read results.
  spdlog::set_level(spdlog::level::warn);
  return doctest::Context(argc, argv).run();
}
