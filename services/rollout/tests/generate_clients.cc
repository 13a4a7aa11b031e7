// A client process for rollout_gauges_test: opens STREAMS Generate streams to ADDRESS
// (SAMPLES samples of MAX_NEW tokens each, prompt PROMPT_IDS, comma-separated), says
// "started N" once every call is sent, and then holds them open without reading until
// it is killed (or its stdin closes): what a gateway killed with -9 leaves behind.
//
//   generate_clients ADDRESS STREAMS SAMPLES MAX_NEW PROMPT_IDS
#include <grpcpp/create_channel.h>

#include <chrono>
#include <iostream>
#include <memory>
#include <string>
#include <vector>

#include "absl/strings/numbers.h"
#include "absl/strings/str_split.h"
#include "rlfleet/v1/rollout.grpc.pb.h"

int main(int argc, char** argv) {
  int streams = 0, samples = 0, max_new = 0;
  if (argc != 6 || !absl::SimpleAtoi(argv[2], &streams) || !absl::SimpleAtoi(argv[3], &samples) ||
      !absl::SimpleAtoi(argv[4], &max_new)) {
    std::cerr << "usage: generate_clients ADDRESS STREAMS SAMPLES MAX_NEW PROMPT_IDS\n";
    return 2;
  }
  rlfleet::v1::GenerateRequest request;
  request.set_num_samples(samples);
  request.mutable_sampling()->set_temperature(1.0f);
  request.mutable_sampling()->set_ignore_eos(true);
  request.mutable_sampling()->set_max_new_tokens(max_new);
  for (absl::string_view id : absl::StrSplit(argv[5], ',')) {
    int32_t token = 0;
    if (!absl::SimpleAtoi(id, &token)) {
      std::cerr << "generate_clients: PROMPT_IDS: `" << id << "` is not a token id\n";
      return 2;
    }
    request.add_prompt_token_ids(token);
  }
  auto stub = rlfleet::v1::RolloutService::NewStub(grpc::CreateChannel(argv[1], grpc::InsecureChannelCredentials()));
  std::vector<std::unique_ptr<grpc::ClientContext>> contexts;
  std::vector<std::unique_ptr<grpc::ClientReader<rlfleet::v1::GenerateResponse>>> readers;
  for (int i = 0; i < streams; ++i) {
    request.set_request_id("killed-" + std::to_string(i));
    contexts.push_back(std::make_unique<grpc::ClientContext>());
    contexts.back()->set_deadline(std::chrono::system_clock::now() + std::chrono::minutes(5));
    readers.push_back(stub->Generate(contexts.back().get(), request));  // (returns once the request is sent)
  }
  std::cout << "started " << streams << std::endl;
  for (std::string line; std::getline(std::cin, line);) {
  }
  return 0;  // (never reached in the test: it is killed first)
}
