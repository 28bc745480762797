"""mmrlvr.rubric"""
